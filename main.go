// Command image-refresh pins Kubernetes workloads to the digest their tag
// points to now, and keeps them pinned. See README.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/image-refresh/image-refresh/internal/cli"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cli.NewRootFor(os.Args[0], os.Stdout, os.Stderr).ExecuteContext(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image-refresh:", err)
	}
	return cli.ExitCode(err)
}
