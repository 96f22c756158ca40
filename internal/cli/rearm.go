package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// rearmOptions are `rearm`'s flags: Validate checks them, Run re-arms the
// group (pass.Runner.Rearm holds the domain steps).
type rearmOptions struct {
	common
	group string
}

func newRearm(o *options) *cobra.Command {
	ro := &rearmOptions{common: common{options: *o}}
	cmd := &cobra.Command{
		Use:   "rearm [--config FILE] [--kubeconfig FILE] --group NAME",
		Short: "Clear a group's attempt counter and lockout",
		Long: `rearm clears the refresh-attempt counter and the refresh-flap-detected lockout
marker on the group's anchor, so that the next tick acts again; it also ends
a flapping tag's hold and takes the digests lockouts locked on out of
quarantine. Every lockout message names this command. Fix what kept the
rollout from settling first (a NotReady node, a crashing pod), or the group
locks out again. See docs/states/locked-out.md.`,
		Args: noArgs,
		RunE: validateAndRun(ro),
	}
	ro.bind(cmd)
	cmd.Flags().StringVar(&ro.group, "group", "", "the group to re-arm (required)")
	return cmd
}

// command is the shape of a command's options (cert-manager's): Validate
// checks the flags that need no config and no cluster, Run does the work.
type command interface {
	Validate() error
	Run(ctx context.Context, stdout, stderr io.Writer) error
}

// validateAndRun is a command's cobra RunE.
func validateAndRun(o command) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		if err := o.Validate(); err != nil {
			return err
		}
		return o.Run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr())
	}
}

// Validate checks the flags that need no config and no cluster.
func (o *rearmOptions) Validate() error {
	if o.group == "" {
		return invalid("--group is required")
	}
	return nil
}

// Run finds the group (configured, or discovered by its label) and re-arms
// it, printing what it cleared to stdout; logs go to stderr.
func (o *rearmOptions) Run(ctx context.Context, stdout, stderr io.Writer) error {
	cfg, err := o.loadServed()
	if err != nil {
		return err
	}
	log := newLogger(stderr, o.logFormat)
	if _, ok := cfg.Group(o.group); !ok {
		if cfg, err = o.withDiscovered(ctx, cfg, nil); err != nil {
			return err
		}
	}
	g, ok := cfg.Group(o.group)
	if !ok {
		return invalid("--group: no group %q in the config or among the labelled workloads (`%s` lists them)", o.group, o.statusCommand())
	}
	r, err := o.runner(cfg, log, nil)
	if err != nil {
		return err
	}
	res, err := r.Rearm(ctx, *g)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, res.Message)
	return nil
}
