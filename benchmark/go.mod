module github.com/smartroute/smartroute/benchmark

go 1.26.8

require (
	github.com/mattn/go-isatty v0.0.22
	github.com/rs/zerolog v1.35.1
	sigs.k8s.io/yaml v1.6.0
)

require go.yaml.in/yaml/v2 v2.4.2 // indirect

require (
	github.com/mattn/go-colorable v0.1.15 // indirect
	github.com/smartroute/smartroute/dispatcher v0.0.0
	golang.org/x/sys v0.46.0 // indirect
)

replace github.com/smartroute/smartroute/proto => ../proto

replace github.com/smartroute/smartroute/dispatcher => ../dispatcher
