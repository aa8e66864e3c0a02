module github.com/smartroute/smartroute/worker-agent

go 1.26.8

require (
	github.com/cenkalti/backoff/v5 v5.0.3
	github.com/gorilla/websocket v1.5.3
	github.com/hashicorp/golang-lru/v2 v2.0.7
	github.com/rs/zerolog v1.35.1
	github.com/smartroute/smartroute/proto v0.0.0
	go.uber.org/goleak v1.3.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	golang.org/x/sys v0.29.0 // indirect
)

replace github.com/smartroute/smartroute/proto => ../proto
