package refresh

import "testing"

// A digest record that is not a digest (hand-edited, truncated) is never
// pinned: it is treated as absent, with a WARN naming the annotation and
// its value, and the tick re-records the registry's latest without
// touching a target (R5, R1).
func TestDecide_R1_R5_ARecordThatIsNotADigestIsTreatedAsAbsent(t *testing.T) {
	g := group(withImage("api", on(webAPI)))
	for name, bad := range map[string]string{
		"garbage":         "latest",
		"truncated":       "sha256:abc",
		"uppercase hex":   "sha256:" + "ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789",
		"a whole pin ref": pinned(dA),
		"empty":           "",
	} {
		t.Run(name, func(t *testing.T) {
			p := decide(t, settings(), observe(g, withAnchor(pinnedBefore("api", dA)), withAnchor(ann(k.Record("api"), bad)),
				withLatest("api", dB), withLive(webAPI, pinned(dA))), want{
				bookkeeping: kv{k.Record("api"): "<B>"},
				findings:    []string{"api: WARN - benign", "api: INFO - benign"},
				rows:        []string{"api web/api: first-observed"},
			})
			if !t.Failed() {
				contains(t, "warning", p.Findings[0].Message, k.Record("api"))
				contains(t, "warning", p.Findings[0].Message, "not a digest; treated as absent")
			}
		})
	}
}
