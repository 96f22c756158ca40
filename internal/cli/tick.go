package cli

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/image-refresh/image-refresh/internal/metrics"
)

func newTick(o *options) *cobra.Command {
	var (
		c           = common{options: *o}
		dryRun      bool
		metricsFile string
	)
	cmd := &cobra.Command{
		Use:   "tick [--config FILE] [--kubeconfig FILE] [--dry-run] [--log-format text|json]",
		Short: "Run one reconcile pass over every group (the CronJob mode)",
		Long: `tick resolves every managed image in its registry — the config's groups and
the workloads labelled <annotationPrefix>/enabled=true (or in a namespace
labelled so) — reads every target's
live image, re-pins what drifted or reverted and records what rolled out, under
the settled guard, the attempt counter and the lockout (docs/rules.md; the
order of writes and every exit code: docs/tick.md).

Exit codes:
  0  every group healthy or benignly skipped (not settled below the ceiling,
     first observation, registry NOTE)
  1  a group needs a human: lockout, a streak ceiling reached, a stale operator
     pin, an API error, a misconfiguration found at run time
  2  the config or the flags are invalid; nothing was read or written`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := c.loadServed()
			if err != nil {
				return err
			}
			log := newLogger(cmd.ErrOrStderr(), c.logFormat)
			// A discovery that cannot list (RBAC, the API) must not keep the
			// configured groups from their pass; it is loud (R15) and the
			// tick exits 1.
			found, discoveryErr := c.discoverGroups(cmd.Context(), cfg, log)
			if ee := (*ExitError)(nil); errors.As(discoveryErr, &ee) {
				return discoveryErr
			}
			if discoveryErr != nil {
				log.Error("discovery failed: the labelled workloads are not managed this tick", "error", discoveryErr,
					"remediation", "grant list on namespaces and the workload kinds (docs/discovery.md), or pass --discovery=false")
			} else if found != nil {
				cfg = found.cfg
			}
			m := metrics.New()
			r, err := c.runner(cfg, log, m)
			if err != nil {
				return err
			}
			// D1: a workload whose label went is let go (its state
			// removed, its pin kept) before the pass; a dry run writes
			// nothing.
			if found != nil && !dryRun {
				if err := found.adopt(cmd.Context(), r.Workloads, r.States(), c.watchNamespaces, log); err != nil {
					log.Error("discovery could not look for the workloads no longer labelled; none was let go", "error", err,
						"remediation", "grant list on the workload kinds (docs/discovery.md), or pass --discovery=false")
					discoveryErr = err
				}
			}
			res := r.AllGroups(cmd.Context(), dryRun)
			if dryRun {
				printPlans(cmd.OutOrStdout(), res.Plans)
			}
			if metricsFile != "" {
				if err := m.WriteTextfile(metricsFile); err != nil {
					log.Warn("could not write the metrics file", "path", metricsFile, "error", err)
				}
			}
			if discoveryErr != nil {
				return &ExitError{Code: ExitNeedsHuman, Err: discoveryErr}
			}
			if res.NeedsHuman() {
				return &ExitError{Code: ExitNeedsHuman, Err: fmt.Errorf("a group needs attention; see the log lines above or run `%s`", c.statusCommand())}
			}
			return nil
		},
	}
	c.bind(cmd)
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "decide and print the plan; write nothing (no annotation, image or event)")
	cmd.Flags().StringVar(&metricsFile, "metrics-file", "", "write Prometheus metrics in text format to this file after the tick (node-exporter textfile collector)")
	return cmd
}
