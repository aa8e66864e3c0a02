module github.com/smartroute/smartroute/benchmark

go 1.26.8

require (
	github.com/mattn/go-isatty v0.0.22
	github.com/rs/zerolog v1.35.1
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/labstack/echo/v4 v4.16.0 // indirect
	github.com/labstack/gommon v0.5.0 // indirect
	github.com/mitchellh/colorstring v0.0.0-20190213212951-d06e56a500db // indirect
	github.com/rivo/uniseg v0.4.7 // indirect
	github.com/schollz/progressbar/v3 v3.19.1 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	github.com/valyala/fasttemplate v1.2.2 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/net v0.59.0 // indirect
	golang.org/x/term v0.46.0 // indirect
	golang.org/x/text v0.42.0 // indirect
)

require (
	github.com/mattn/go-colorable v0.1.15 // indirect
	github.com/smartroute/smartroute/batch v0.0.0
	github.com/smartroute/smartroute/dispatcher v0.0.0
	golang.org/x/sys v0.48.0 // indirect
)

replace github.com/smartroute/smartroute/proto => ../proto

replace github.com/smartroute/smartroute/dispatcher => ../dispatcher

replace github.com/smartroute/smartroute/batch => ../batch
