module github.com/smartroute/smartroute/proto

go 1.26.8

require (
	github.com/bufbuild/protocompile v0.14.1
	github.com/gorilla/websocket v1.5.3
	github.com/planetscale/vtprotobuf v0.6.0
	google.golang.org/protobuf v1.36.12
)

require golang.org/x/sync v0.8.0 // indirect
