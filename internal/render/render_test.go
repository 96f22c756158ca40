package render

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/internal/config"
)

const (
	d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	d3 = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
)

// testConfig has one group "web" (anchor Deployment tb/api) with an image
// on a private registry with three targets, a Docker Hub image, and an
// operator-pinned one; pinFormat is set by the caller.
const testConfig = `pinFormat: %s
groups:
  - name: web
    anchor: {kind: Deployment, namespace: tb, name: api}
    images:
      - name: api
        repository: registry.example.com/acme/api
        tag: prod
        targets:
          - {kind: Deployment, namespace: tb, name: api, container: api}
          - {kind: DaemonSet, namespace: tb, name: agent, container: agent}
          - {kind: StatefulSet, namespace: tb, name: db, container: api}
          - {kind: CronJob, namespace: tb, name: nightly, container: api}
          - {kind: Deployment, namespace: tb, name: api, container: migrate}
          - {kind: Deployment, namespace: tb, name: api, container: shipper}
          - {kind: Deployment, namespace: tb, name: api, volume: models}
      - name: hub
        repository: acme/hub
        tag: v1
        targets:
          - {kind: Deployment, namespace: tb, name: api, container: hub}
      - name: fixed
        repository: registry.example.com/acme/fixed
        tag: prod
        pinnedDigest: ` + d3 + `
        targets:
          - {kind: Deployment, namespace: tb, name: api, container: fixed}
  - name: other
    anchor: {kind: Deployment, namespace: ops, name: other}
    images:
      - name: api
        repository: registry.example.com/acme/api
        tag: prod
        targets:
          - {kind: Deployment, namespace: ops, name: other, container: api}
`

func loadConfig(t testing.TB, format string) *config.Config {
	t.Helper()
	if format == "" {
		format = "tag+digest"
	}
	cfg, err := config.Parse([]byte(strings.Replace(testConfig, "%s", format, 1)), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// deploy renders a Deployment tb/api whose containers are given as YAML
// sequence items (indented for the containers list).
func deploy(ns, name, containers string) string {
	meta := "  name: " + name + "\n"
	if ns != "" {
		meta += "  namespace: " + ns + "\n"
	}
	return "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n" + meta +
		"spec:\n  template:\n    spec:\n      containers:\n" + containers
}

var web = map[ImageKey]string{{"web", "api"}: d1, {"web", "hub"}: d1, {"web", "fixed"}: d1}

func TestPin_B2(t *testing.T) {
	const tag = "registry.example.com/acme/api:prod"
	const pinned = tag + "@" + d1
	tests := []struct {
		name      string
		format    string
		namespace string // --namespace; "default" when empty
		in        string
		recorded  map[ImageKey]string
		unread    map[string]string
		// want is the expected output; "" means the input unchanged.
		want  string
		notes []string // substrings, one per expected note, in order
	}{
		{
			name: "a Deployment target on repo:tag is pinned to the recorded digest as repo:tag@digest",
			in:   deploy("tb", "api", "        - name: api\n          image: "+tag+"\n"),
			want: deploy("tb", "api", "        - name: api\n          image: "+pinned+"\n"),
		},
		{
			name:   "pinFormat digest writes repo@digest",
			format: "digest",
			in:     deploy("tb", "api", "        - name: api\n          image: "+tag+"\n"),
			want:   deploy("tb", "api", "        - name: api\n          image: registry.example.com/acme/api@"+d1+"\n"),
		},
		{
			name: "DaemonSet and StatefulSet targets are pinned",
			in: "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: agent, namespace: tb}\nspec:\n  template:\n    spec:\n      containers: [{name: agent, image: " + tag + "}]\n" +
				"---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db, namespace: tb}\nspec:\n  template:\n    spec:\n      containers:\n      - image: " + tag + "\n        name: api\n",
			want: "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: agent, namespace: tb}\nspec:\n  template:\n    spec:\n      containers: [{name: agent, image: " + pinned + "}]\n" +
				"---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db, namespace: tb}\nspec:\n  template:\n    spec:\n      containers:\n      - image: " + pinned + "\n        name: api\n",
		},
		{
			name: "a CronJob target is pinned under spec.jobTemplate; its apiVersion is batch/v1",
			in: "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: nightly, namespace: tb}\nspec:\n  schedule: '0 3 * * *'\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          containers: [{name: api, image: " + tag + "}]\n" +
				"---\napiVersion: apps/v1\nkind: CronJob\nmetadata: {name: nightly, namespace: tb}\nspec: {jobTemplate: {spec: {template: {spec: {containers: [{name: api, image: " + tag + "}]}}}}}\n",
			want: "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: nightly, namespace: tb}\nspec:\n  schedule: '0 3 * * *'\n  jobTemplate:\n    spec:\n      template:\n        spec:\n          containers: [{name: api, image: " + pinned + "}]\n" +
				"---\napiVersion: apps/v1\nkind: CronJob\nmetadata: {name: nightly, namespace: tb}\nspec: {jobTemplate: {spec: {template: {spec: {containers: [{name: api, image: " + tag + "}]}}}}}\n",
		},
		{
			name:      "a document without metadata.namespace is in the --namespace namespace",
			namespace: "tb",
			in:        deploy("", "api", "        - name: api\n          image: "+tag+"\n"),
			want:      deploy("", "api", "        - name: api\n          image: "+pinned+"\n"),
		},
		{
			name:  "a document without a namespace read as default names the target's namespace in a note",
			in:    deploy("", "api", "        - name: api\n          image: "+tag+"\n"),
			notes: []string{`read as namespace "default" (--namespace), but the target is in namespace tb; pass the release namespace with --namespace`},
		},
		{
			name: "the same workload in another namespace is not managed",
			in:   deploy("staging", "api", "        - name: api\n          image: "+tag+"\n"),
		},
		{
			name: "another container or init container of a target workload is not managed",
			in: deploy("tb", "api", "        - name: sidecar\n          image: "+tag+"\n") +
				"      initContainers:\n        - name: seed\n          image: " + tag + "\n",
		},
		{
			name: "K1: an init container that is a target is pinned like a container, a native sidecar too",
			in: deploy("tb", "api", "        - name: sidecar\n          image: "+tag+"\n") +
				"      initContainers:\n        - name: migrate\n          image: " + tag + "\n" +
				"        - name: shipper\n          restartPolicy: Always\n          image: " + tag + "\n",
			want: deploy("tb", "api", "        - name: sidecar\n          image: "+tag+"\n") +
				"      initContainers:\n        - name: migrate\n          image: " + pinned + "\n" +
				"        - name: shipper\n          restartPolicy: Always\n          image: " + pinned + "\n",
		},
		{
			name: "K1: an image volume that is a target is pinned at its reference; other volumes are left alone",
			in: deploy("tb", "api", "        - name: sidecar\n          image: "+tag+"\n") +
				"      volumes:\n        - name: scratch\n          emptyDir: {}\n        - name: models\n          image:\n            reference: " + tag + "\n            pullPolicy: IfNotPresent\n" +
				"        - name: other\n          image: {reference: " + tag + "}\n",
			want: deploy("tb", "api", "        - name: sidecar\n          image: "+tag+"\n") +
				"      volumes:\n        - name: scratch\n          emptyDir: {}\n        - name: models\n          image:\n            reference: " + pinned + "\n            pullPolicy: IfNotPresent\n" +
				"        - name: other\n          image: {reference: " + tag + "}\n",
		},
		{
			name: "a Deployment of another API group is not managed",
			in:   strings.Replace(deploy("tb", "api", "        - name: api\n          image: "+tag+"\n"), "apps/v1", "extensions/v1beta1", 1),
		},
		{
			name: "repo:tag@another-digest is moved to the recorded digest",
			in:   deploy("tb", "api", "        - name: api\n          image: "+tag+"@"+d2+"\n"),
			want: deploy("tb", "api", "        - name: api\n          image: "+pinned+"\n"),
		},
		{
			name: "R7: an image already on the recorded digest is unchanged, in either format",
			in: deploy("tb", "api", "        - name: api\n          image: registry.example.com/acme/api@"+d1+"\n") +
				"---\n" + deploy("tb", "api", "        - name: api\n          image: "+pinned+"\n"),
		},
		{
			name: "R7: a mirror prefix on the recorded digest is not a revert",
			in:   deploy("tb", "api", "        - name: api\n          image: mirror.local/acme/api@"+d1+"\n"),
		},
		{
			name:  "R3: repo:tag on a mirror registry is left as rendered with a note",
			in:    deploy("tb", "api", "        - name: api\n          image: mirror.local/acme/api:prod\n"),
			notes: []string{"image api (group web) in document 1: Deployment tb/api container api: left as rendered: mirror.local/acme/api is served by another registry than registry.example.com/acme/api, and render cannot prove it holds the recorded digest (docs/mirrors.md)"},
		},
		{
			name:  "another repository on the same registry is left as rendered with a note",
			in:    deploy("tb", "api", "        - name: api\n          image: registry.example.com/acme/other:prod\n"),
			notes: []string{"repository registry.example.com/acme/other is not the configured registry.example.com/acme/api"},
		},
		{
			name:  "another tag is left as rendered with a note",
			in:    deploy("tb", "api", "        - name: api\n          image: registry.example.com/acme/api:canary\n"),
			notes: []string{`tag "canary" is not the configured tag "prod"`},
		},
		{
			name: "a Docker Hub image written in another form matches and keeps its form",
			in:   deploy("tb", "api", "        - name: hub\n          image: docker.io/acme/hub:v1\n"),
			want: deploy("tb", "api", "        - name: hub\n          image: docker.io/acme/hub:v1@"+d1+"\n"),
		},
		{
			name: "R2: an operator-pinned image is left alone silently",
			in:   deploy("tb", "api", "        - name: fixed\n          image: registry.example.com/acme/fixed:prod\n"),
		},
		{
			name:     "no record: the tag stays and one note names the image once for all its containers",
			recorded: map[ImageKey]string{},
			in: deploy("tb", "api", "        - name: api\n          image: "+tag+"\n") +
				"---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: agent, namespace: tb}\nspec: {template: {spec: {containers: [{name: agent, image: " + tag + "}]}}}\n",
			notes: []string{"image api (group web) in document 1: Deployment tb/api container api; document 2: DaemonSet tb/agent container agent: left on the tag: the group's anchor holds no recorded digest yet"},
		},
		{
			name:     "an unreadable anchor: the note gives the reason",
			recorded: map[ImageKey]string{},
			unread:   map[string]string{"web": "connection refused"},
			in:       deploy("tb", "api", "        - name: api\n          image: "+tag+"\n"),
			notes:    []string{"left on the tag: the group's anchor could not be read: connection refused"},
		},
		{
			name:     "the record of the same image name in another group is not used",
			recorded: map[ImageKey]string{{"other", "api"}: d1},
			in:       deploy("tb", "api", "        - name: api\n          image: "+tag+"\n"),
			notes:    []string{"image api (group web)"},
		},
		{
			name:     "a recorded value that is not a digest is never pinned (R1)",
			recorded: map[ImageKey]string{{"web", "api"}: "sha256:nothex"},
			in:       deploy("tb", "api", "        - name: api\n          image: "+tag+"\n"),
			notes:    []string{"the recorded digest on the anchor is not a digest"},
		},
		{
			name: "double and single quotes are kept",
			in:   deploy("tb", "api", "        - name: api\n          image: \""+tag+"\"\n        - name: hub\n          image: 'acme/hub:v1'\n"),
			want: deploy("tb", "api", "        - name: api\n          image: \""+pinned+"\"\n        - name: hub\n          image: 'acme/hub:v1@"+d1+"'\n"),
		},
		{
			name: "a value on the line after its key, with a comment after it",
			in:   deploy("tb", "api", "        - name: api\n          image:\n            "+tag+"   # the tag\n"),
			want: deploy("tb", "api", "        - name: api\n          image:\n            "+pinned+"   # the tag\n"),
		},
		{
			name: "multibyte characters before the image on the same line",
			in:   deploy("tb", "api", "        - {name: api, x: \"ünïcødé ☃\", image: "+tag+"}\n"),
			want: deploy("tb", "api", "        - {name: api, x: \"ünïcødé ☃\", image: "+pinned+"}\n"),
		},
		{
			name: "CRLF line endings and a byte order mark are kept",
			in:   "\xef\xbb\xbf" + strings.ReplaceAll(deploy("tb", "api", "        - name: api\n          image: "+tag+"\n"), "\n", "\r\n"),
			want: "\xef\xbb\xbf" + strings.ReplaceAll(deploy("tb", "api", "        - name: api\n          image: "+pinned+"\n"), "\n", "\r\n"),
		},
		{
			name: "a target inside a List is pinned",
			in:   "apiVersion: v1\nkind: List\nitems:\n- apiVersion: apps/v1\n  kind: Deployment\n  metadata: {name: api, namespace: tb}\n  spec: {template: {spec: {containers: [{name: api, image: " + tag + "}]}}}\n",
			want: "apiVersion: v1\nkind: List\nitems:\n- apiVersion: apps/v1\n  kind: Deployment\n  metadata: {name: api, namespace: tb}\n  spec: {template: {spec: {containers: [{name: api, image: " + pinned + "}]}}}\n",
		},
		{
			name:  "an image that is a YAML alias is left as rendered with a note",
			in:    "x: &img " + tag + "\n---\n" + deploy("tb", "api", "        - name: sidecar\n          image: &img "+tag+"\n        - name: api\n          image: *img\n"),
			notes: []string{"document 2: Deployment tb/api container api: left as rendered: the image is a YAML alias (*img)"},
		},
		{
			name:  "an image that carries an anchor is left as rendered with a note",
			in:    deploy("tb", "api", "        - name: api\n          image: &img "+tag+"\n        - name: sidecar\n          image: *img\n"),
			notes: []string{"the image carries a YAML anchor (&img)"},
		},
		{
			name:  "a pod template shared through an alias is left as rendered with a note",
			in:    "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: api, namespace: tb}\nx: &tmpl {spec: {containers: [{name: api, image: " + tag + "}]}}\nspec:\n  template: *tmpl\n",
			notes: []string{"its template is written through a YAML alias"},
		},
		{
			name:  "a block scalar image is left as rendered with a note",
			in:    deploy("tb", "api", "        - name: api\n          image: |-\n            "+tag+"\n"),
			notes: []string{"the image is a block scalar"},
		},
		{
			name:  "an explicitly tagged image is left as rendered with a note",
			in:    deploy("tb", "api", "        - name: api\n          image: !!str "+tag+"\n"),
			notes: []string{"the image has an explicit YAML tag"},
		},
		{
			name:  "a quoted image with escapes is left as rendered with a note",
			in:    deploy("tb", "api", "        - name: api\n          image: \"registry.example.com/acme/api\\x3aprod\"\n"),
			notes: []string{"cannot locate the image text"},
		},
		{
			name: "a merge key is followed for reading and noted for writing",
			in: "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: api, namespace: tb}\nspec:\n  template:\n    spec:\n      containers:\n" +
				"        - &base {name: sidecar, image: " + tag + "}\n        - <<: *base\n          name: api\n",
			notes: []string{"the image is written through a YAML merge key"},
		},
		{
			name: "documents that manage nothing are left alone",
			in:   "# just a comment\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: api, namespace: tb}\ndata:\n  image: " + tag + "\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.namespace
			if ns == "" {
				ns = "default"
			}
			s, err := Parse([]byte(tc.in), loadConfig(t, tc.format), ns)
			if err != nil {
				t.Fatal(err)
			}
			recorded := tc.recorded
			if recorded == nil {
				recorded = web
			}
			res := s.Pin(recorded, tc.unread)
			want := tc.want
			if want == "" {
				want = tc.in
			}
			if string(res.Out) != want {
				t.Errorf("output differs:\n got: %q\nwant: %q", res.Out, want)
			}
			if (len(res.Changes) > 0) != (tc.want != "") {
				t.Errorf("changes %+v, want some: %v", res.Changes, tc.want != "")
			}
			var got []string
			for _, n := range res.Notes {
				got = append(got, n.String())
			}
			if len(got) != len(tc.notes) {
				t.Fatalf("notes:\n%s\nwant %d matching %q", strings.Join(got, "\n"), len(tc.notes), tc.notes)
			}
			for i, w := range tc.notes {
				if !strings.Contains(got[i], w) {
					t.Errorf("note %d = %q, want it to contain %q", i, got[i], w)
				}
				// A likely misconfiguration is a warning; a benign state (no
				// record yet, R3, shared YAML text) is not.
				misconfigured := strings.Contains(got[i], "not a target") || strings.Contains(got[i], "is not the configured") || strings.Contains(got[i], "is not a digest")
				if res.Notes[i].Warning != misconfigured {
					t.Errorf("note %d Warning = %v, want %v", i, res.Notes[i].Warning, misconfigured)
				}
			}
		})
	}
}

func TestParse_B2_SyntaxErrorNamesDocumentAndLine(t *testing.T) {
	tests := []struct {
		name, in string
		doc      int
		lines    []int // the YAML parser names the line of the problem, or of the collection around it
	}{
		{"an unclosed flow sequence in the second document", "a: 1\n---\n# two\nb: [1, 2\n---\nc: 3\n", 2, []int{3, 4}},
		{"a tab indentation in the third document", "a: 1\n---\nb: 2\n---\nc:\n\t- 3\n", 3, []int{6}},
		{"a bad mapping in the first document", "a: b: c\n---\nd: 1\n", 1, []int{1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in), loadConfig(t, ""), "default")
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("err = %v, want a *SyntaxError", err)
			}
			if se.Document != tc.doc || !slices.Contains(tc.lines, se.Line) {
				t.Errorf("document %d line %d, want document %d line in %v (%v)", se.Document, se.Line, tc.doc, tc.lines, err)
			}
			if want := fmt.Sprintf("document %d, line %d: ", tc.doc, se.Line); !strings.HasPrefix(err.Error(), want) {
				t.Errorf("message %q does not start with %q", err, want)
			}
		})
	}
}

func TestGroups_B2_OnlyGroupsWithTargetsInTheStream(t *testing.T) {
	cfg := loadConfig(t, "")
	in := deploy("ops", "other", "        - name: api\n          image: x/y:z\n") + "---\n" +
		deploy("tb", "api", "        - name: fixed\n          image: x/y:z\n")
	s, err := Parse([]byte(in), cfg, "default")
	if err != nil {
		t.Fatal(err)
	}
	// group web has only its operator-pinned image here: no record needed.
	if got := s.Groups(); len(got) != 1 || got[0] != "other" {
		t.Errorf("Groups() = %q, want [other]", got)
	}
}
