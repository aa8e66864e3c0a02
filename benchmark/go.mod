module github.com/smartroute/smartroute/benchmark

go 1.26.8

require github.com/smartroute/smartroute/proto v0.0.0

replace github.com/smartroute/smartroute/proto => ../proto
