module github.com/dqueue/delayqueue/cmd/dqbench

go 1.22.0

require (
	github.com/dqueue/delayqueue v0.0.0-20261126005016-56676f8d25c3
	github.com/dqueue/delayqueue/dashboard v0.0.0-20261126005016-56676f8d25c3
	github.com/dqueue/delayqueue/dqprom v0.0.0-20261126005016-56676f8d25c3
	github.com/prometheus/client_golang v1.22.0
	github.com/prometheus/common v0.62.0
	github.com/redis/go-redis/v9 v9.17.3
	github.com/stretchr/testify v1.12.1
	golang.org/x/sync v0.7.0
)

require (
	github.com/alicebob/miniredis/v2 v2.40.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/dgryski/go-rendezvous v0.0.0-20200823014737-9f7001d12a5f // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_model v0.6.1 // indirect
	github.com/prometheus/procfs v0.15.1 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	github.com/yuin/gopher-lua v1.1.1 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.30.0 // indirect
	google.golang.org/protobuf v1.36.5 // indirect
)
