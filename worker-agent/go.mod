module github.com/smartroute/smartroute/worker-agent

go 1.26.8

require github.com/smartroute/smartroute/proto v0.0.0

require (
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/gorilla/websocket v1.5.3 // indirect
	github.com/hashicorp/golang-lru/v2 v2.0.7 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/rs/zerolog v1.35.1 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sys v0.29.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/smartroute/smartroute/proto => ../proto
