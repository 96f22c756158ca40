package notify

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The payloads in testdata/payloads follow each sender's documented JSON
// (docs/notifications.md names the reference); only Distribution's is also
// proven against the real registry (internal/cli's notify test).

func payload(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "payloads", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sender(name string) Sender {
	for _, s := range Senders() {
		if s.Name == name {
			return s
		}
	}
	panic("no sender " + name)
}

func TestSenders_EachDocumentedPushPayloadNamesItsRepositoryAndTag(t *testing.T) {
	github := http.Header{"X-Github-Event": {"package"}}
	for _, tc := range []struct {
		sender, file string
		header       http.Header
		want         []Hint
	}{
		// A blob push (no tag) and a pull are no hint; the manifest push by
		// tag is, with the host the client pushed to.
		{"distribution", "distribution.json", nil, []Hint{{"registry.example.com/acme/api", "prod"}}},
		{"harbor", "harbor.json", nil, []Hint{{"harbor.example.com/acme/api", "prod"}}},
		{"harbor", "harbor-cloudevents.json", nil, []Hint{{"harbor.example.com/acme/api", "prod"}}},
		{"dockerhub", "dockerhub.json", nil, []Hint{{"docker.io/acme/api", "prod"}}},
		// GitHub spells the owner as the account does; ghcr.io names are
		// lower case.
		{"github", "github.json", github, []Hint{{"ghcr.io/acme/api", "prod"}}},
		{"gar", "gar.json", nil, []Hint{{"europe-west1-docker.pkg.dev/acme-prod/images/api", "prod"}}},
		{"acr", "acr.json", nil, []Hint{{"acme.azurecr.io/acme/api", "prod"}}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, err := sender(tc.sender).parse(tc.header, payload(t, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("hints %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSenders_EventsThatAreNotAPushByTagAreNoHint(t *testing.T) {
	for _, tc := range []struct {
		name, sender string
		header       http.Header
		body         string
	}{
		{"a Distribution pull", "distribution", nil, `{"events":[{"action":"pull","target":{"repository":"acme/api","tag":"prod"},"request":{"host":"r.example"}}]}`},
		{"a Distribution delete", "distribution", nil, `{"events":[{"action":"delete","target":{"repository":"acme/api","tag":"prod"},"request":{"host":"r.example"}}]}`},
		{"a Distribution push by digest", "distribution", nil, `{"events":[{"action":"push","target":{"repository":"acme/api"},"request":{"host":"r.example"}}]}`},
		{"a Distribution push without the registry host", "distribution", nil, `{"events":[{"action":"push","target":{"repository":"acme/api","tag":"prod"}}]}`},
		{"a Harbor pull", "harbor", nil, `{"type":"PULL_ARTIFACT","event_data":{"resources":[{"tag":"prod","resource_url":"h.example/acme/api:prod"}]}}`},
		{"a Harbor push by digest", "harbor", nil, `{"type":"PUSH_ARTIFACT","event_data":{"resources":[{"resource_url":"h.example/acme/api@sha256:0000000000000000000000000000000000000000000000000000000000000000"}]}}`},
		{"a Docker Hub body without a tag", "dockerhub", nil, `{"push_data":{},"repository":{"repo_name":"acme/api"}}`},
		{"a GitHub ping", "github", http.Header{"X-Github-Event": {"ping"}}, `{"zen":"Keep it logically awesome."}`},
		{"a GitHub npm package", "github", http.Header{"X-Github-Event": {"package"}}, `{"action":"published","package":{"name":"api","namespace":"acme","package_type":"npm","package_version":{"container_metadata":{"tag":{"name":"prod"}}}}}`},
		{"an untagged GitHub container version", "github", http.Header{"X-Github-Event": {"package"}}, `{"action":"published","package":{"name":"api","namespace":"acme","package_type":"CONTAINER","package_version":{"container_metadata":{"tag":{"name":""}}}}}`},
		{"an Artifact Registry delete", "gar", nil, `{"message":{"data":"eyJhY3Rpb24iOiJERUxFVEUiLCJ0YWciOiJoLmV4YW1wbGUvcC9yL2FwaTpwcm9kIn0="}}`},
		{"an ACR chart push", "acr", nil, `{"action":"chart_push","target":{"repository":"acme/api","tag":"prod"},"request":{"host":"acme.azurecr.io"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sender(tc.sender).parse(tc.header, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 0 {
				t.Errorf("hints %v, want none", got)
			}
		})
	}
}

func TestSenders_AMalformedBodyIsAnError(t *testing.T) {
	for _, s := range Senders() {
		if _, err := s.parse(http.Header{"X-Github-Event": {"package"}}, []byte(`{"events":`)); err == nil {
			t.Errorf("%s: a truncated body parsed without an error", s.Name)
		}
	}
}

// fuzzParser runs one sender's parser on arbitrary bodies: it never panics
// and every hint it returns names a repository and a tag.
func fuzzParser(f *testing.F, name string, header http.Header, seed string) {
	f.Add(payload(f, seed))
	s := sender(name)
	f.Fuzz(func(t *testing.T, body []byte) {
		hints, err := s.parse(header, body)
		if err != nil && len(hints) > 0 {
			t.Fatalf("hints %v with an error %v", hints, err)
		}
		for _, h := range hints {
			if h.Repository == "" || h.Tag == "" {
				t.Fatalf("hint %q lacks a repository or a tag", h)
			}
		}
	})
}

func FuzzParseDistribution(f *testing.F) { fuzzParser(f, "distribution", nil, "distribution.json") }
func FuzzParseHarbor(f *testing.F)       { fuzzParser(f, "harbor", nil, "harbor.json") }
func FuzzParseDockerHub(f *testing.F)    { fuzzParser(f, "dockerhub", nil, "dockerhub.json") }
func FuzzParseGitHub(f *testing.F) {
	fuzzParser(f, "github", http.Header{"X-Github-Event": {"package"}}, "github.json")
}
func FuzzParseGAR(f *testing.F) { fuzzParser(f, "gar", nil, "gar.json") }
func FuzzParseACR(f *testing.F) { fuzzParser(f, "acr", nil, "acr.json") }
