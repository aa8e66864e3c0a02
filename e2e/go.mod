module github.com/smartroute/smartroute/e2e

go 1.26.8
