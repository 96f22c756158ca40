package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/internal/pass"
	"github.com/image-refresh/image-refresh/internal/state"
	"github.com/image-refresh/image-refresh/internal/workload"
)

// suspendTarget finds a group's anchor for suspend and resume: an unknown
// group is invalid (exit 2) and nothing is written.
func (c *common) suspendTarget(cmd *cobra.Command, group string) (*config.Config, config.Group, *pass.Runner, error) {
	cfg, err := c.loadServed()
	if err != nil {
		return nil, config.Group{}, nil, err
	}
	log := newLogger(cmd.ErrOrStderr(), c.logFormat)
	if _, ok := cfg.Group(group); !ok {
		if cfg, err = c.withDiscovered(cmd.Context(), cfg, nil); err != nil {
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

func newSuspend(o *options) *cobra.Command {
	var (
		c                   = common{options: *o}
		group, reason, till string
		forDuration         string
	)
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
24 h. See docs/states/suspended.md.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if group == "" {
				return invalid("--group is required")
			}
			now := time.Now
			if c.now != nil {
				now = c.now
			}
			value := "true"
			switch {
			case forDuration != "" && till != "":
				return invalid("--for and --until: give one end, not both; nothing written")
			case forDuration != "":
				d, err := time.ParseDuration(forDuration)
				if err != nil || d <= 0 {
					return invalid("--for: %q is not a positive duration (such as 90m, 2h, 72h); nothing written", forDuration)
				}
				value = now().Add(d).UTC().Truncate(time.Second).Format(time.RFC3339)
			case till != "":
				t, err := time.Parse(time.RFC3339, till)
				if err != nil {
					return invalid("--until: %q is not an RFC 3339 time (such as 2026-12-24T18:00:00Z); nothing written", till)
				}
				if !t.After(now()) {
					return invalid("--until: %s has passed; nothing written", till)
				}
				value = t.UTC().Format(time.RFC3339)
			}
			cfg, g, r, err := c.suspendTarget(cmd, group)
			if err != nil {
				return err
			}
			keys := state.Keys{Prefix: cfg.AnnotationPrefix}
			by := workload.SuspendFieldManager
			// P/suspended-by names who in the copy too: a rollback before
			// the next pass cannot lose it (R25).
			set := map[string]*string{keys.Suspend(): &value, keys.SuspendReason(): nil, keys.SuspendedBy(): &by}
			if reason != "" {
				set[keys.SuspendReason()] = &reason
			}
			until := "resumed (" + c.commandFor("resume", group) + ")"
			if value != "true" {
				until = value
			}
			msg := fmt.Sprintf("suspended group %s until %s: image-refresh writes nothing to its targets meanwhile", group, until)
			if reason != "" {
				msg += "; reason: " + reason
			}
			return c.writeSuspension(cmd.Context(), r, g, set, "Suspended", msg, cmd)
		},
	}
	c.bind(cmd)
	cmd.Flags().StringVar(&group, "group", "", "the group to suspend (required)")
	cmd.Flags().StringVar(&forDuration, "for", "", "end the suspension after this long (such as 2h); default: until resume")
	cmd.Flags().StringVar(&till, "until", "", "end the suspension at this RFC 3339 time; default: until resume")
	cmd.Flags().StringVar(&reason, "reason", "", "why, shown by status and in the Event")
	return cmd
}

func newResume(o *options) *cobra.Command {
	var (
		c     = common{options: *o}
		group string
	)
	cmd := &cobra.Command{
		Use:   "resume [--config FILE] [--kubeconfig FILE] --group NAME",
		Short: "End a group's suspension: image-refresh writes to its targets again",
		Long: `resume removes the annotations P/suspend and P/suspend-reason from the group's
anchor and from the copy of its state. ` + "`run`" + ` acts at once (the removal starts a pass); a tick acts on its next run.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if group == "" {
				return invalid("--group is required")
			}
			cfg, g, r, err := c.suspendTarget(cmd, group)
			if err != nil {
				return err
			}
			keys := state.Keys{Prefix: cfg.AnnotationPrefix}
			obj, err := r.Workloads.Get(cmd.Context(), g.Anchor)
			if err != nil {
				return fmt.Errorf("resume group %s: %w", group, err)
			}
			// The current state: a rollback may have taken the suspension
			// off the anchor, not out of its copy (R25).
			view, err := r.States().Read(cmd.Context(), obj)
			if err != nil {
				return fmt.Errorf("resume group %s: %w", group, err)
			}
			if _, ok := view.State[keys.Suspend()]; !ok {
				fmt.Fprintf(cmd.OutOrStdout(), "group %s is not suspended; nothing to do\n", group)
				return nil
			}
			set := map[string]*string{keys.Suspend(): nil, keys.SuspendReason(): nil}
			msg := fmt.Sprintf("resumed group %s: image-refresh writes to its targets again", group)
			return c.writeSuspension(cmd.Context(), r, g, set, "Resumed", msg, cmd)
		},
	}
	c.bind(cmd)
	cmd.Flags().StringVar(&group, "group", "", "the group to resume (required)")
	return cmd
}

// writeSuspension writes the suspension on g's anchor and in the copy of
// its state (R25: a later `rollout undo` cannot take it off) as the
// suspend field manager, records a Normal Event and prints msg.
func (c *common) writeSuspension(ctx context.Context, r *pass.Runner, g config.Group, set map[string]*string, reason, msg string, cmd *cobra.Command) error {
	obj, err := r.States().UpdateAs(ctx, g.Anchor, workload.SuspendFieldManager, nil, set)
	if err != nil {
		return fmt.Errorf("%s group %s: %w", cmd.Name(), g.Name, err)
	}
	if err := r.Workloads.Event(ctx, obj, "Normal", reason, msg); err != nil {
		newLogger(cmd.ErrOrStderr(), c.logFormat).Warn("could not record an event", "object", g.Anchor.String(), "error", err)
	}
	fmt.Fprintln(cmd.OutOrStdout(), msg)
	return nil
}
