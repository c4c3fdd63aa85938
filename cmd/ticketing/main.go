// Command ticketing is the single Ticketing binary: cluster node, local dev
// cluster and tools. Each subcommand lives in cmd/internal/cli.
package main

import (
	"os"

	"ticketing/cmd/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
