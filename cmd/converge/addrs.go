package main

import (
	"github.com/converge-sync/converge/internal/config"
	"github.com/converge-sync/converge/internal/graphprojector"
	"github.com/converge-sync/converge/internal/indexprojector"
)

// The variables of the projectors' addresses, which every command that
// asks a projector reads.
const (
	envIndexAddr = "CONVERGE_PROJECTOR_INDEX_ADDR"
	envGraphAddr = "CONVERGE_PROJECTOR_GRAPH_ADDR"
)

// indexAddrFlag binds -index-addr, the index projector's address
// (host:port, or an http:// or https:// URL), defaulting to the address
// the projector listens on by default; what adds to the usage.
func indexAddrFlag(f *config.Flags, what string) *string {
	return f.String("index-addr", envIndexAddr, indexprojector.DefaultMetricsAddr,
		"the index projector's metrics address (host:port, or https://host:port)"+what)
}

// graphAddrFlag is indexAddrFlag for the graph projector (-graph-addr).
func graphAddrFlag(f *config.Flags, what string) *string {
	return f.String("graph-addr", envGraphAddr, graphprojector.DefaultMetricsAddr,
		"the graph projector's metrics address (host:port, or https://host:port)"+what)
}
