package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/image-refresh/image-refresh/internal/state"
)

func newRearm(o *options) *cobra.Command {
	var (
		c     = common{options: *o}
		group string
	)
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
		RunE: func(cmd *cobra.Command, _ []string) error {
			if group == "" {
				return invalid("--group is required")
			}
			cfg, err := c.loadServed()
			if err != nil {
				return err
			}
			log := newLogger(cmd.ErrOrStderr(), c.logFormat)
			if _, ok := cfg.Group(group); !ok {
				if cfg, err = c.withDiscovered(cmd.Context(), cfg, nil); err != nil {
					return err
				}
			}
			g, ok := cfg.Group(group)
			if !ok {
				return invalid("--group: no group %q in the config or among the labelled workloads (`%s` lists them)", group, c.statusCommand())
			}
			r, err := c.runner(cfg, log, nil)
			if err != nil {
				return err
			}
			anchor := g.Anchor
			obj, err := r.Workloads.Get(cmd.Context(), anchor)
			if err != nil {
				return fmt.Errorf("rearm group %s: %w", group, err)
			}
			// The current state: the copy's, when a rollback rewound the
			// anchor's (R25).
			view, err := r.States().Read(cmd.Context(), obj)
			if err != nil {
				return fmt.Errorf("rearm group %s: %w", group, err)
			}
			keys := state.Keys{Prefix: cfg.AnnotationPrefix}
			expect, set := map[string]*string{}, map[string]*string{}
			cleared := []string{}
			var images []string
			for _, img := range g.Images {
				images = append(images, img.Name)
			}
			// The attempt, its holder and the lockout marker; a flapping
			// tag's hold (R21) ends too, and the digests lockouts locked on
			// leave quarantine (R23).
			for _, k := range keys.Rearmed(images) {
				if v, ok := view.State[k]; ok {
					expect[k], set[k] = &v, nil
					cleared = append(cleared, k)
				}
			}
			if len(set) == 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "group %s is not locked out, has no pending attempt and no held image; nothing to do\n", group)
				return nil
			}
			if _, err := r.States().Update(cmd.Context(), anchor, expect, set); err != nil {
				return fmt.Errorf("rearm group %s: %w", group, err)
			}
			msg := fmt.Sprintf("re-armed group %s: cleared %s; the next tick acts again", group, strings.Join(cleared, ", "))
			if err := r.Workloads.Event(cmd.Context(), obj, "Normal", "RefreshRearmed", msg); err != nil {
				log.Warn("could not record an event", "object", anchor.String(), "error", err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), msg)
			return nil
		},
	}
	c.bind(cmd)
	cmd.Flags().StringVar(&group, "group", "", "the group to re-arm (required)")
	return cmd
}
