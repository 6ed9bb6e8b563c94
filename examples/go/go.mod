module github.com/apprentice-llm/apprentice/examples/go

go 1.24

require (
	github.com/apprentice-llm/apprentice/clients/go v0.0.0
	google.golang.org/grpc v1.85.0
)

// The stubs generated from protos/ into clients/go (clients/README.md says how).
replace github.com/apprentice-llm/apprentice/clients/go => ../../clients/go
