package main

import (
	"context"
	"flag"
	"io"
	"log/slog"

	"ticketing/cluster"
	"ticketing/cmd/internal/cli"
	"ticketing/cmd/ticketlab/internal/faults"
	"ticketing/cmd/ticketlab/internal/frametrace"
	"ticketing/sidecar"
)

// runNode is `ticketlab node`: the product's node command, and with
// --fault-file the lab's faults in its seams (cluster.Config.PeerNet, Now).
func runNode(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.RunNode(ctx, args, stdout, stderr, nodeOptions())
}

func nodeOptions() cli.NodeOptions {
	var file, trace string
	return cli.NodeOptions{
		Name: "ticketlab node",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&file, "fault-file", "", "obey the cut and frozen peer links and the clock offset in this JSON `FILE`, reread every 20 ms (see cmd/ticketlab/README.md); without it: ticketing node")
			fs.StringVar(&trace, "frame-trace", "", "timestamp every grant (G) and lost event (X) written to a client into this `FILE` (internal/frametrace; needs a plaintext client port): how `bench extend` sees the leader's apply")
		},
		Setup: func(ctx context.Context, cfg *cluster.Config, log *slog.Logger) error {
			if trace != "" {
				if err := frametrace.Setup(ctx, cfg, trace, log); err != nil {
					return err
				}
			}
			if file == "" {
				return nil
			}
			_, err := faults.Node(ctx, cfg, file, log)
			return err
		},
	}
}

// runSidecar is `ticketlab sidecar`: the product's sidecar command, and
// with --fault-file a dialer that drops its cluster connections on demand
// (sidecar.Config.Dialer).
func runSidecar(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.RunSidecar(ctx, args, stdout, stderr, sidecarOptions())
}

func sidecarOptions() cli.SidecarOptions {
	var file string
	return cli.SidecarOptions{
		Name: "ticketlab sidecar",
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&file, "fault-file", "", "drop every cluster connection each time the drop_connections counter in this JSON `FILE` grows, reread every 20 ms; without it: ticketing sidecar")
		},
		Setup: func(ctx context.Context, cfg *sidecar.Config, log *slog.Logger) error {
			if file == "" {
				return nil
			}
			_, err := faults.Sidecar(ctx, cfg, file, log)
			return err
		},
	}
}
