package config

import (
	"slices"
	"strings"
	"testing"
)

// group is a valid groups section, for raw-YAML cases that break other keys.
const group = `groups:
  - name: g
    anchor: {kind: Deployment, namespace: ns, name: app}
    images:
      - name: app
        repository: acme/app
        tag: prod
        targets: [{kind: Deployment, namespace: ns, name: app, container: app}]
`

func TestParse_RejectsBadYAMLNamingTheKeyAndLine(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"an empty file is rejected", "", []string{"config is empty"}},
		{"a file of comments only is rejected", "# nothing\n\n", []string{"config is empty"}},
		{"a null document is rejected", "~\n", []string{"config is empty"}},
		{"a top-level list is rejected", "- a\n- b\n", []string{"must be a YAML mapping", "(line 1)"}},
		{"a YAML syntax error is rejected with its line", "rolloutTimeout: 10m\ngroups: [\n", []string{"invalid YAML", "line"}},
		{"a second YAML document is rejected", group + "---\nrolloutTimeout: 1m\n", []string{"multiple YAML documents"}},
		{"an unknown top-level key is rejected with its name and line",
			"rolloutTimeot: 10m\n" + group, []string{`unknown key "rolloutTimeot"`, "(line 1)", "known keys:", "rolloutTimeout"}},
		{"an unknown key in a target is rejected with its path and line",
			strings.Replace(group, "container: app}", "container: app, contaner: x}", 1),
			[]string{`groups[0].images[0].targets[0]: unknown key "contaner"`, "(line 8)"}},
		{"an unknown key in a registry is rejected with its path and line",
			"registries:\n  - host: ghcr.io\n    password: hunter2\n" + group,
			[]string{`registries[0]: unknown key "password"`, "(line 3)"}},
		{"an unknown key in the anchor is rejected with its path and line",
			strings.Replace(group, "name: app}", "name: app, container: x}", 1),
			[]string{`groups[0].anchor: unknown key "container"`, "(line 3)"}},
		{"a bad duration is rejected naming the field and line",
			"apiTimeout: 1s\nrolloutTimeout: 10 minutes\n" + group, []string{`rolloutTimeout: invalid duration "10 minutes"`, "(line 2)"}},
		{"a duration without a unit is rejected",
			"tickTimeout: 600\n" + group, []string{`tickTimeout: invalid duration "600"`, "(line 1)"}},
		{"a count that is not an integer is rejected",
			"maxSkipTicks: three\n" + group, []string{`maxSkipTicks: invalid integer "three"`, "(line 1)"}},
		{"a quoted count is rejected",
			"maxSkipTicks: \"3\"\n" + group, []string{`maxSkipTicks: invalid integer "3"`}},
		{"a count too big for an int is rejected",
			"maxReadFailures: 99999999999999999999999\n" + group, []string{"maxReadFailures: invalid integer"}},
		{"a non-boolean insecure is rejected",
			"registries: [{host: ghcr.io, insecure: maybe}]\n" + group, []string{`registries[0].insecure: invalid boolean "maybe"`}},
		{"a list where a string belongs is rejected",
			"annotationPrefix: [a]\n" + group, []string{"annotationPrefix: expected a string, got a list", "(line 1)"}},
		{"a string where the groups list belongs is rejected",
			"groups: everything\n", []string{`groups: expected a list, got "everything"`}},
		{"a string where a group belongs is rejected",
			"groups: [g]\n", []string{`groups[0]: expected a mapping, got "g" (line 1)`}},
		{"a duplicate key is rejected with both lines",
			"rolloutTimeout: 1m\nrolloutTimeout: 2m\n" + group, []string{"rolloutTimeout: duplicate key (first at line 1) (line 2)"}},
		{"a YAML alias is rejected",
			"apiTimeout: &t 10s\nregistryTimeout: *t\n" + group, []string{"registryTimeout: YAML aliases (*t) are not supported"}},
		{"a YAML merge key is rejected",
			"registries:\n  - &r {host: ghcr.io}\n  - <<: *r\n    insecure: true\n" + group, []string{"registries[1].<<: YAML merge keys"}},
		{"R24: a bad rollout window time is reported at its line, and nothing applies",
			"rolloutWindows:\n  - days: [Mon, Tue]\n    start: \"22:00\"\n    end: \"25:00\"\n" + group, []string{`rolloutWindows[0].end: invalid time "25:00"`, "(line 4)"}},
		{"R24: a weekday that is not one is reported at its line",
			"rolloutWindows:\n  - days:\n      - Mon\n      - Mnday\n    start: \"22:00\"\n    end: \"06:00\"\n" + group, []string{`rolloutWindows[0].days[1]: "Mnday" is not a weekday`, "(line 4)"}},
		{"a missing container is reported at its target's line",
			strings.Replace(group, ", container: app}", "}", 1), []string{"groups[0].images[0].targets[0].container: missing (line 8)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.yaml), "bad.yaml")
			if n := len(fieldErrors(err)); n != 1 {
				t.Errorf("want exactly one problem, got %d:\n%v", n, err)
			}
			if c != nil {
				t.Errorf("Parse returned a config with an error")
			}
			if err == nil {
				t.Fatalf("no error, want one containing %q", tt.want)
			}
			for _, w := range append(tt.want, "bad.yaml") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestParse_ReportsEveryProblemAtOnce(t *testing.T) {
	data := []byte(`rolloutTimeout: soon
maxRefreshAttempts: 0
pinFormat: sha
colour: blue
groups:
  - name: Bad_Name
    anchor: {kind: Pod, namespace: ns, name: app}
    images:
      - name: app
        repository: acme/app
        tag: prod@sha256:0000
        targets:
          - {kind: Deployment, namespace: ns, name: app, container: [app]}
          - {kind: Deployment, namespace: ns, name: app}
`)
	_, err := Parse(data, "many.yaml")
	type problem struct {
		path string
		line int
	}
	var got []problem
	for _, fe := range fieldErrors(err) {
		got = append(got, problem{fe.Path, fe.Line})
	}
	// Decoding problems come first in file order, then validation's. The
	// container that did not decode is reported once, not again as missing.
	want := []problem{
		{"rolloutTimeout", 1},
		{"", 4}, // unknown key colour
		{"groups[0].images[0].targets[0].container", 13},
		{"maxRefreshAttempts", 2},
		{"pinFormat", 3},
		{"groups[0].name", 6},
		{"groups[0].anchor.kind", 7},
		{"groups[0].images[0].tag", 11},
		{"groups[0].images[0].targets[1].container", 14},
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems\n got: %v\nwant: %v\nerror:\n%v", got, want, err)
	}
	if err == nil || !strings.HasPrefix(err.Error(), "many.yaml: 9 problems:\n") {
		t.Errorf("error does not start with the source and count:\n%v", err)
	}
}
