module github.com/dqueue/delayqueue/cmd/dqctl

go 1.22.0

require (
	github.com/dqueue/delayqueue v0.0.0-20261126005016-56676f8d25c3
	github.com/dqueue/delayqueue/dashboard v0.0.0-20261126005016-56676f8d25c3
	github.com/redis/go-redis/v9 v9.17.3
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.9
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/alicebob/miniredis/v2 v2.40.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dgryski/go-rendezvous v0.0.0-20200823014737-9f7001d12a5f // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
