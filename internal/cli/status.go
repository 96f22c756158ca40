package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/image-refresh/image-refresh/internal/refresh"
)

func newStatus(o *options) *cobra.Command {
	var (
		c        = common{options: *o}
		output   string
		exitCode bool
	)
	cmd := &cobra.Command{
		Use:   "status [--config FILE] [--kubeconfig FILE] [-o table|wide|json] [--exit-code]",
		Short: "Show every target's state and what to do about it",
		Long: `status reads the cluster and the registry as a tick would and shows, for
every (group, image, target) — configured, and discovered by label; without
--config every managed target of the cluster — its state, with the
remediation for anything not pinned. It writes nothing.

States (one page each in docs/states/, e.g. docs/states/locked-out.md):
` + stateList() + `

Exit codes:
  0  status could run; with --exit-code, also: no group needs a human
  1  with --exit-code: a group needs a human, as a tick would exit 1 for it
     (lockout, a streak ceiling, a stale operator pin, an API error, …);
     or the cluster could not be reached
  2  the config or the flags are invalid; nothing was read`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "wide" && output != "json" {
				return invalid("-o: %q is not one of table, wide, json", output)
			}
			cfg, err := c.loadServed()
			if err != nil {
				return err
			}
			log := newLogger(io.Discard, c.logFormat)
			found, discoveryErr := c.withDiscovered(cmd.Context(), cfg, log)
			if ee := (*ExitError)(nil); errors.As(discoveryErr, &ee) {
				return discoveryErr
			}
			if discoveryErr != nil {
				// The configured groups are still shown; the failure is said.
				fmt.Fprintf(cmd.ErrOrStderr(), "image-refresh: %v; only the configured groups are shown\n", discoveryErr)
			} else {
				cfg = found
			}
			r, err := c.runner(cfg, log, nil)
			if err != nil {
				return err
			}
			res := r.AllGroups(cmd.Context(), true)
			var rows []refresh.Row
			for _, p := range res.Plans {
				rows = append(rows, p.Rows...)
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if rows == nil {
					rows = []refresh.Row{}
				}
				if err := enc.Encode(rows); err != nil {
					return err
				}
			} else {
				printRows(cmd.OutOrStdout(), rows, output == "wide")
			}
			if !exitCode {
				return nil
			}
			// The same verdict as a tick's exit code: the pass's findings
			// that need a human (R15), and a discovery that could not list.
			if discoveryErr != nil {
				return &ExitError{Code: ExitNeedsHuman, Err: discoveryErr}
			}
			if res.NeedsHuman() {
				return &ExitError{Code: ExitNeedsHuman, Err: errors.New("a group needs attention; see the rows above and docs/states/README.md")}
			}
			return nil
		},
	}
	c.bind(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, wide (adds NAMESPACE and KIND, the full digest) or json")
	cmd.Flags().BoolVar(&exitCode, "exit-code", false, "exit 1 when a group needs a human (the findings a tick exits 1 for), 0 otherwise; for scripts and CI checks")
	return cmd
}

// stateList is the states of the state table (refresh.States), as prose
// wrapped for help.
func stateList() string {
	names := make([]string, 0, len(refresh.States()))
	for _, s := range refresh.States() {
		names = append(names, string(s))
	}
	return "  " + wrap(andList(names), 74, "  ")
}

// printRows prints the status table: the columns widen to the longest
// cell, as kubectl's do, so no name is ever cut (D3); every row not pinned
// is followed by its message and remediation. wide adds the namespace and
// kind of each target and prints the whole digest.
func printRows(w io.Writer, rows []refresh.Row, wide bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if wide {
		fmt.Fprintln(tw, "GROUP\tIMAGE\tNAMESPACE\tKIND\tTARGET\tSTATE\tDIGEST\tRUNNING")
	} else {
		fmt.Fprintln(tw, "GROUP\tIMAGE\tTARGET\tSTATE\tDIGEST\tRUNNING")
	}
	for _, r := range rows {
		digest := r.Latest
		if r.Recorded != "" {
			digest = r.Recorded
		}
		if wide {
			t := r.TargetRef()
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Group, r.Image, t.Namespace, t.Kind, targetCell(r), stateCell(r), orDash(digest), runningCell(r.Running))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Group, r.Image, targetCell(r), stateCell(r), orDash(shortDigest(digest)), runningCell(r.Running))
	}
	tw.Flush()
	for _, r := range rows {
		if r.State == refresh.StatePinned {
			continue
		}
		fmt.Fprintf(w, "\n%s\n", wrap(fmt.Sprintf("%s/%s %s: %s", r.Group, r.Image, r.State, r.Target), 78, "  "))
		fmt.Fprintf(w, "  %s\n", wrap(r.Message, 76, "  "))
		if strings.Contains(r.Running, "(") {
			fmt.Fprintf(w, "  running: %s\n", wrap(r.Running, 67, "           "))
		}
		if r.Remediation != "" {
			fmt.Fprintf(w, "  fix: %s\n", wrap(r.Remediation, 71, "       "))
		}
		// The cause first, then what else holds because of it (O2).
		for _, b := range r.Also {
			fmt.Fprintf(w, "  also %s\n", wrap(string(b.State)+": "+b.Message, 71, "    "))
			if b.Remediation != "" {
				fmt.Fprintf(w, "    fix: %s\n", wrap(b.Remediation, 69, "         "))
			}
		}
	}
}

// stateCell is a row's state, and the states that hold beside it:
// "drifted (+running-stale)".
func stateCell(r refresh.Row) string {
	s := string(r.State)
	for _, b := range r.Also {
		s += " (+" + string(b.State) + ")"
	}
	return s
}

// printPlans prints what a --dry-run tick would do.
func printPlans(w io.Writer, plans []*refresh.Plan) {
	for _, p := range plans {
		fmt.Fprintf(w, "group %s (anchor %s): attempts %d, skip streak %d, locked out %v\n", p.Group, p.Anchor, p.Attempts, p.SkipStreak, p.LockedOut)
		for k, v := range p.Bookkeeping.Set {
			fmt.Fprintf(w, "  annotate %s=%s\n", k, show(v))
		}
		for k, v := range p.ClearSkip.Set {
			fmt.Fprintf(w, "  annotate %s=%s\n", k, show(v))
		}
		if rp := p.Repin; rp != nil {
			for k, v := range rp.AttemptWrite.Set {
				fmt.Fprintf(w, "  annotate %s=%s (before re-imaging)\n", k, show(v))
			}
			for _, c := range rp.Changes {
				for _, ic := range c.Images {
					fmt.Fprintf(w, "  re-image %s container %s: %s -> %s (%s)\n", c.Workload, ic.Container, ic.From, ic.To, ic.Cause)
				}
			}
			for _, wl := range rp.Wait {
				fmt.Fprintf(w, "  wait for %s to settle\n", wl)
			}
			for k, v := range rp.ClearWrite.Set {
				fmt.Fprintf(w, "  annotate %s=%s (after every rollout settled)\n", k, show(v))
			}
			for k, v := range rp.RecordWrite.Set {
				fmt.Fprintf(w, "  annotate %s=%s (after every rollout settled)\n", k, show(v))
			}
		}
	}
}

// runningCell is the RUNNING column: pods on the expected digest of those
// of the current template ("2/3"; the pod and node off it are in the
// detail lines), "-" when not checked (N1).
func runningCell(running string) string {
	if running == "" {
		return "-"
	}
	if i := strings.Index(running, " ("); i >= 0 {
		return running[:i] + "!"
	}
	return running
}

func show(v *string) string {
	if v == nil {
		return "<delete>"
	}
	return *v
}

// targetCell is a row's target in the table: "name/container" (the
// namespace is in the detail lines and in -o wide), and for an image that
// is not a container's what holds it: "api/migrate (init container)",
// "api/models (image volume)" (K1).
func targetCell(r refresh.Row) string {
	t := r.TargetRef()
	name := t.Container
	if v, ok := t.Volume(); ok {
		name = v
	}
	if t.Name == "" {
		return r.Target
	}
	cell := t.Name + "/" + name
	if r.Slot != "" {
		cell += " (" + r.Slot + ")"
	}
	return cell
}

func shortDigest(d string) string {
	if i := strings.IndexByte(d, ':'); i >= 0 && len(d) > i+8 {
		return d[:i+8]
	}
	return d
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func wrap(s string, width int, indent string) string {
	var b strings.Builder
	line := 0
	var words []string
	for _, word := range strings.Fields(s) {
		// A word longer than a line (a long reference) is cut into pieces.
		for len(word) > width {
			words, word = append(words, word[:width]), word[width:]
		}
		words = append(words, word)
	}
	for i, word := range words {
		if i > 0 && line+1+len(word) > width {
			b.WriteString("\n" + indent)
			line = 0
		} else if i > 0 {
			b.WriteByte(' ')
			line++
		}
		b.WriteString(word)
		line += len(word)
	}
	return b.String()
}
