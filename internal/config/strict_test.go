package config

import (
	"strings"
	"testing"
)

// strictBase is a valid config that reaches every struct of the file: each
// case adds one key to one line of it, marked by its comment.
const strictBase = `rolloutTimeout: 10m # root
rolloutWindows:
  - {days: [Mon], start: "22:00", end: "06:00"} # window
registries:
  - {host: ghcr.io} # registry
verification:
  - name: release # policy
    repositories: [ghcr.io/acme/*]
    cosign:
      keyless:
        - {issuer: https://token.actions.githubusercontent.com, subject: ci@acme.dev} # keyless
    attestations:
      - {predicateType: https://slsa.dev/provenance/v1} # attestation
kinds:
  - {group: argoproj.io, version: v1alpha1, kind: Rollout, podTemplate: spec.template} # kind
groups:
  - name: dev
    anchor: {kind: Deployment, namespace: dev, name: api} # dev anchor
    images:
      - name: api
        repository: ghcr.io/acme/api
        tag: prod
        targets: [{kind: Deployment, namespace: dev, name: api, container: api}]
  - name: prod # group
    promotion: {after: dev} # promotion
    anchor: {kind: Rollout, namespace: prod, name: api}
    images:
      - name: api # image
        repository: ghcr.io/acme/api
        tag: prod
        targets:
          - {kind: Rollout, namespace: prod, name: api, container: api} # target
`

// TestParse_R19_UnknownKeysAndBadValuesAreRefusedNamingPathAndLine: the
// config is decoded strictly by the YAML library, and each of its messages
// names the field path and line (the library gives only the line). A key
// that is not a field, or is a field the file must not set (yaml:"-"), is
// refused at every level, listing the keys that are known there.
func TestParse_R19_UnknownKeysAndBadValuesAreRefusedNamingPathAndLine(t *testing.T) {
	// The base parses: what the cases refuse is the key they add.
	if c, err := Parse([]byte(strictBase), "base.yaml"); err != nil || len(c.Groups) != 2 || c.Groups[1].Promotion == nil {
		t.Fatalf("the base config does not parse: %v", err)
	}
	tests := []struct {
		marker, add   string
		path, msg     string
		knownIncludes string
	}{
		{"# root", "\ncolour: blue", "", `unknown key "colour"`, "rolloutWindows"},
		{"# window", "", "rolloutWindows[0]", `unknown key "zone"`, "days, end, start"},
		{"# registry", "", "registries[0]", `unknown key "password"`, "caFile, host, insecure"},
		{"# policy", "\n    key: k.pub", "verification[0]", `unknown key "key"`, "attestations, cosign, name, notation, repositories"},
		{"# keyless", "", "verification[0].cosign.keyless[0]", `unknown key "subjectRegexp"`, "issuer, subject, subjectRegExp"},
		{"# attestation", "", "verification[0].attestations[0]", `unknown key "condition"`, "conditions, predicateType"},
		{"# kind", "", "kinds[0]", `unknown key "plural"`, "group, kind, podTemplate, resource, selector, version"},
		{"# dev anchor", "", "groups[0].anchor", `unknown key "container"`, "kind, name, namespace"},
		{"# group", "\n    discovered: true", "groups[1]", `unknown key "discovered"`, "anchor, images, name, onFailedRollout, promotion"},
		{"# promotion", "", "groups[1].promotion", `unknown key "images"`, "after, attestedBy, publish, soak"},
		{"# image", "\n        digest: sha256:00", "groups[1].images[0]", `unknown key "digest"`, "name, pinnedDigest, repository, tag, targets"},
		{"# target", "", "groups[1].images[0].targets[0]", `unknown key "contaner"`, "container, kind, name, namespace, volume"},
	}
	lines := strings.Split(strictBase, "\n")
	for _, tt := range tests {
		t.Run(tt.msg+" at "+tt.path, func(t *testing.T) {
			key := strings.TrimPrefix(tt.msg, "unknown key ")
			key = strings.Trim(key, `"`)
			var out []string
			line := 0
			for i, l := range lines {
				if !strings.HasSuffix(l, tt.marker) {
					out = append(out, l)
					continue
				}
				line = i + 1
				switch {
				case tt.add != "":
					out = append(out, l+tt.add)
					line++ // the key is on the next line
				case strings.Contains(l, "}"):
					// A flow mapping: the key goes inside it.
					j := strings.LastIndex(l, "}")
					out = append(out, l[:j]+", "+key+": x"+l[j:])
				default:
					t.Fatalf("no place for %s on line %d", key, i+1)
				}
			}
			if line == 0 {
				t.Fatalf("marker %q not in the base", tt.marker)
			}
			c, err := Parse([]byte(strings.Join(out, "\n")), "strict.yaml")
			if c != nil || err == nil {
				t.Fatalf("the unknown key %q was accepted", key)
			}
			fes := fieldErrors(err)
			if len(fes) != 1 {
				t.Fatalf("want one problem, got %d:\n%v", len(fes), err)
			}
			fe := fes[0]
			if fe.Path != tt.path || fe.Line != line || !strings.HasPrefix(fe.Msg, tt.msg+" (known keys: ") || !strings.Contains(fe.Msg, tt.knownIncludes) {
				t.Errorf("got path %q line %d %q\nwant path %q line %d %q listing %s", fe.Path, fe.Line, fe.Msg, tt.path, line, tt.msg, tt.knownIncludes)
			}
		})
	}

	// Type errors of several fields on one line are each put on their own
	// field, in file order.
	bad := strings.Replace(strictBase, "{kind: Rollout, namespace: prod, name: api, container: api}",
		"{kind: Rollout, namespace: [prod], name: {api: 1}, container: api}", 1)
	bad = strings.Replace(bad, "rolloutTimeout: 10m", "rolloutTimeout: 10", 1)
	bad = strings.Replace(bad, "{after: dev}", "{after: dev, soak: 1 hour}", 1)
	_, err := Parse([]byte(bad), "types.yaml")
	want := []string{
		`rolloutTimeout: invalid duration "10" (write it like "90s" or "10m") (line 1)`,
		`groups[1].promotion.soak: invalid duration "1 hour" (write it like "90s" or "10m") (line 25)`,
		`groups[1].images[0].targets[0].namespace: expected a string, got a list (line 32)`,
		`groups[1].images[0].targets[0].name: expected a string, got a mapping (line 32)`,
	}
	fes := fieldErrors(err)
	if len(fes) != len(want) {
		t.Fatalf("want %d problems, got %d:\n%v", len(want), len(fes), err)
	}
	for i, fe := range fes {
		if fe.Error() != want[i] {
			t.Errorf("problem %d\n got: %s\nwant: %s", i, fe.Error(), want[i])
		}
	}
}
