package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/pass"
)

// suspendTarget finds a group's anchor for suspend and resume: an unknown
// group is invalid (exit 2) and nothing is written.
func (c *common) suspendTarget(ctx context.Context, stderr io.Writer, group string) (*config.Config, config.Group, *pass.Runner, error) {
	cfg, err := c.loadServed()
	if err != nil {
		return nil, config.Group{}, nil, err
	}
	log := newLogger(stderr, c.logFormat)
	if _, ok := cfg.Group(group); !ok {
		if cfg, err = c.withDiscovered(ctx, cfg, nil); err != nil {
			return nil, config.Group{}, nil, err
		}
	}
	g, ok := cfg.Group(group)
	if !ok {
		return nil, config.Group{}, nil, invalid("--group: no group %q in the config or among the labelled workloads (`%s` lists them); nothing written", group, c.statusCommand())
	}
	r, err := c.runner(cfg, log, nil)
	if err != nil {
		return nil, config.Group{}, nil, err
	}
	return cfg, *g, r, nil
}

// commandFor renders another command of this one's config.
func (c *common) commandFor(verb, group string) string {
	if c.configPath == "" {
		return fmt.Sprintf("image-refresh %s --group %s", verb, group)
	}
	return fmt.Sprintf("image-refresh %s --config %s --group %s", verb, c.configPath, group)
}

// suspendOptions are `suspend`'s flags: Validate checks them and turns
// them into the suspension, Run writes it (pass.Runner.Suspend holds the
// domain steps).
type suspendOptions struct {
	common
	group, reason, till, forDuration string
	suspension                       pass.Suspension
}

func newSuspend(o *options) *cobra.Command {
	so := &suspendOptions{common: common{options: *o}}
	cmd := &cobra.Command{
		Use:   "suspend [--config FILE] [--kubeconfig FILE] --group NAME [--for DURATION] [--until TIME] [--reason TEXT]",
		Short: "Stop every write to a group's targets until resume or a time",
		Long: `suspend stops every write image-refresh makes to the group's targets — new
digests, revert re-pins, the webhook's and render's pins — until
` + "`image-refresh resume --group NAME`" + `, or until the end given with --for or --until,
so that a deliberate rollback (kubectl rollout undo) stays where you put it.
Records and findings still update, and status says suspended, by whom, why
and until when. It writes the annotation P/suspend (true, or the RFC 3339
end) and P/suspend-reason on the group's anchor, and in the copy of the
group's state that a rollback cannot reach: a rollout undo after suspend
does not take the suspension off. A GitOps repository can hold the
annotations instead. A suspension without an end becomes a finding after
24 h. Groups that follow this one (promotion) are held too. See
docs/states/suspended.md.`,
		Args: noArgs,
		RunE: validateAndRun(so),
	}
	so.bind(cmd)
	cmd.Flags().StringVar(&so.group, "group", "", "the group to suspend (required)")
	cmd.Flags().StringVar(&so.forDuration, "for", "", "end the suspension after this long (such as 2h); default: until resume")
	cmd.Flags().StringVar(&so.till, "until", "", "end the suspension at this RFC 3339 time; default: until resume")
	cmd.Flags().StringVar(&so.reason, "reason", "", "why, shown by status and in the Event")
	return cmd
}

// Validate checks the flags, which need no config and no cluster, and sets
// the suspension: nothing is written when they are wrong.
func (o *suspendOptions) Validate() error {
	if o.group == "" {
		return invalid("--group is required")
	}
	now := time.Now
	if o.now != nil {
		now = o.now
	}
	s := pass.Suspension{Reason: o.reason, ResumeCommand: o.commandFor("resume", o.group)}
	switch {
	case o.forDuration != "" && o.till != "":
		return invalid("--for and --until: give one end, not both; nothing written")
	case o.forDuration != "":
		d, err := time.ParseDuration(o.forDuration)
		if err != nil || d <= 0 {
			return invalid("--for: %q is not a positive duration (such as 90m, 2h, 72h); nothing written", o.forDuration)
		}
		s.Until = now().Add(d).UTC().Truncate(time.Second)
	case o.till != "":
		t, err := time.Parse(time.RFC3339, o.till)
		if err != nil {
			return invalid("--until: %q is not an RFC 3339 time (such as 2026-12-24T18:00:00Z); nothing written", o.till)
		}
		if !t.After(now()) {
			return invalid("--until: %s has passed; nothing written", o.till)
		}
		s.Until = t.UTC()
	}
	o.suspension = s
	return nil
}

// Run finds the group's anchor and writes the suspension.
func (o *suspendOptions) Run(ctx context.Context, stdout, stderr io.Writer) error {
	_, g, r, err := o.suspendTarget(ctx, stderr, o.group)
	if err != nil {
		return err
	}
	msg, err := r.Suspend(ctx, g, o.suspension)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, msg)
	return nil
}

// resumeOptions are `resume`'s flags (pass.Runner.Resume holds the domain
// steps).
type resumeOptions struct {
	common
	group string
}

func newResume(o *options) *cobra.Command {
	ro := &resumeOptions{common: common{options: *o}}
	cmd := &cobra.Command{
		Use:   "resume [--config FILE] [--kubeconfig FILE] --group NAME",
		Short: "End a group's suspension: image-refresh writes to its targets again",
		Long: `resume removes the annotations P/suspend and P/suspend-reason from the group's
anchor and from the copy of its state. ` + "`run`" + ` acts at once (the removal starts a pass); a tick acts on its next run.`,
		Args: noArgs,
		RunE: validateAndRun(ro),
	}
	ro.bind(cmd)
	cmd.Flags().StringVar(&ro.group, "group", "", "the group to resume (required)")
	return cmd
}

// Validate checks the flags that need no config and no cluster.
func (o *resumeOptions) Validate() error {
	if o.group == "" {
		return invalid("--group is required")
	}
	return nil
}

// Run finds the group's anchor and ends its suspension.
func (o *resumeOptions) Run(ctx context.Context, stdout, stderr io.Writer) error {
	_, g, r, err := o.suspendTarget(ctx, stderr, o.group)
	if err != nil {
		return err
	}
	msg, err := r.Resume(ctx, g)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, msg)
	return nil
}
