package config

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/image-refresh/image-refresh/internal/imageref"
	"github.com/image-refresh/image-refresh/internal/state"
)

// exampleConfig is what testdata/example.yaml must parse to.
func exampleConfig() *Config {
	return &Config{
		AnnotationPrefix:   "image-refresh.io",
		RolloutTimeout:     10 * time.Minute,
		RegistryTimeout:    15 * time.Second,
		APITimeout:         15 * time.Second,
		TickTimeout:        0,
		MaxRefreshAttempts: 3,
		MaxSkipTicks:       8,
		MaxReadFailures:    8,
		MaxDigestChanges:   3,
		DigestChangeWindow: time.Hour,
		PinCheckInterval:   time.Hour,
		FirstInstall:       FirstInstallPinNextTick,
		PinFormat:          imageref.PinTagAndDigest,
		Registries: []Registry{
			{Host: "127.0.0.1:5000", Insecure: true, CAFile: "/etc/ssl/extra-ca.pem"},
		},
		Groups: []Group{{
			Name:   "control-plane",
			Anchor: Workload{Kind: KindDeployment, Namespace: "tb", Name: "tb-jobs-manager"},
			Images: []Image{{
				Name:       "jobs-manager",
				Repository: "docker.io/tracebloc/jobs-manager",
				Tag:        "prod",
				Targets: []Target{
					{Kind: KindDeployment, Namespace: "tb", Name: "tb-jobs-manager", Container: "api"},
					{Kind: KindDeployment, Namespace: "tb", Name: "tb-requests-proxy", Container: "proxy"},
				},
			}},
		}},
	}
}

// validConfig builds a valid two-image config, changed by mods: the fixture
// the rejection tests start from.
func validConfig(mods ...func(*Config)) *Config {
	c := Defaults()
	c.Groups = []Group{{
		Name:   "control-plane",
		Anchor: Workload{Kind: KindDeployment, Namespace: "tb", Name: "tb-jobs-manager"},
		Images: []Image{
			{
				Name: "jobs-manager", Repository: "docker.io/tracebloc/jobs-manager", Tag: "prod",
				Targets: []Target{
					{Kind: KindDeployment, Namespace: "tb", Name: "tb-jobs-manager", Container: "api"},
					{Kind: KindDeployment, Namespace: "tb", Name: "tb-requests-proxy", Container: "proxy"},
				},
			},
			{
				Name: "resource-monitor", Repository: "docker.io/tracebloc/resource-monitor", Tag: "prod",
				Targets: []Target{
					{Kind: KindDaemonSet, Namespace: "tb", Name: "tb-resource-monitor", Container: "monitor"},
				},
			},
		},
	}}
	for _, mod := range mods {
		mod(c)
	}
	return c
}

// marshal renders c as a config file.
func marshal(t testing.TB, c *Config) []byte {
	t.Helper()
	data, err := yaml.Marshal(c)
	if err != nil {
		t.Fatalf("marshal config: %v", err)
	}
	return data
}

// fieldErrors flattens the tree of joined and wrapped errors.
func fieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(err error) {
		if fe, ok := err.(*FieldError); ok {
			out = append(out, fe)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

func TestParse_TheFullExampleParsesToTheExpectedConfig(t *testing.T) {
	data, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(data, "testdata/example.yaml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if want := exampleConfig(); !reflect.DeepEqual(got, want) {
		t.Errorf("Parse mismatch\n got: %+v\nwant: %+v", got, want)
	}
}

func TestParse_DefaultsFillEveryOptionalSetting(t *testing.T) {
	data := []byte(`
groups:
  - name: g
    anchor: {kind: StatefulSet, namespace: ns, name: db}
    images:
      - name: db
        repository: acme/db
        tag: "1.0"
        targets: [{kind: StatefulSet, namespace: ns, name: db, container: db}]
`)
	got, err := Parse(data, "minimal.yaml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := Defaults()
	want.Groups = []Group{{
		Name:   "g",
		Anchor: Workload{Kind: KindStatefulSet, Namespace: "ns", Name: "db"},
		Images: []Image{{Name: "db", Repository: "acme/db", Tag: "1.0", Targets: []Target{
			{Kind: KindStatefulSet, Namespace: "ns", Name: "db", Container: "db"},
		}}},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse mismatch\n got: %+v\nwant: %+v", got, want)
	}
	if got.AnnotationPrefix != "image-refresh.io" || got.RolloutTimeout != 10*time.Minute ||
		got.RegistryTimeout != 15*time.Second || got.APITimeout != 15*time.Second || got.TickTimeout != 0 ||
		got.MaxRefreshAttempts != 3 || got.MaxSkipTicks != 8 || got.MaxReadFailures != 8 ||
		got.FirstInstall != FirstInstallPinNextTick || got.PinFormat != imageref.PinTagAndDigest {
		t.Errorf("defaults are not the documented ones: %+v", got)
	}
}

func TestParse_TheSeedPrefixTraceblocIOIsAcceptedAndGivesTheSeedKeys(t *testing.T) {
	c := validConfig(func(c *Config) { c.AnnotationPrefix = "tracebloc.io" })
	got, err := Parse(marshal(t, c), "tracebloc.yaml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if got.AnnotationPrefix != "tracebloc.io" {
		t.Errorf("AnnotationPrefix = %q", got.AnnotationPrefix)
	}
	keys := state.ImageKeyNames("jobs-manager")
	for _, want := range []string{"last-refreshed-jobs-manager-digest", "stale-pin-jobs-manager"} {
		if !strings.Contains(strings.Join(keys, " "), want) {
			t.Errorf("AnnotationKeyNames lacks the seed key %q: %v", want, keys)
		}
	}
}

func TestParse_OtherSettingValuesAreAccepted(t *testing.T) {
	c := validConfig(func(c *Config) {
		c.FirstInstall = FirstInstallOnlyAfterEverPinned
		c.PinFormat = imageref.PinDigest
		c.TickTimeout = time.Hour
		c.Groups[0].Images[0].PinnedDigest = "sha256:" + strings.Repeat("ab", 32)
		c.Registries = []Registry{{Host: "docker.io"}, {Host: "localhost:5000", Insecure: true}}
	})
	got, err := Parse(marshal(t, c), "other.yaml")
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Errorf("round trip mismatch\n got: %+v\nwant: %+v", got, c)
	}
}

func TestLoad_ChecksThatEveryCAFileIsAReadablePEMBundle(t *testing.T) {
	dir := t.TempDir()
	goodCA := "testdata/ca.pem" // a throwaway self-signed certificate
	notPEM := dir + "/not.pem"
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		caFile  string
		wantErr []string
	}{
		{"a readable PEM bundle is accepted", goodCA, nil},
		{"no caFile needs no file", "", nil},
		{"a missing file is rejected", dir + "/missing.pem", []string{"registries[0].caFile: cannot read CA bundle", "(line "}},
		{"a file without a certificate is rejected", notPEM, []string{"registries[0].caFile:", "holds no PEM certificate"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig(func(c *Config) {
				c.Registries = []Registry{{Host: "registry.example.com", CAFile: tt.caFile}}
			})
			path := dir + "/config.yaml"
			if err := os.WriteFile(path, marshal(t, c), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := Load(path)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				if !reflect.DeepEqual(got, c) {
					t.Errorf("Load mismatch\n got: %+v\nwant: %+v", got, c)
				}
				return
			}
			if got != nil {
				t.Errorf("Load returned a config with an error")
			}
			for _, w := range append(tt.wantErr, path) {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoad_TheExampleFailsOnlyOnItsMissingCAFile(t *testing.T) {
	// The example names /etc/ssl/extra-ca.pem; point it at a path that
	// surely does not exist, keeping every line where it is.
	b, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := dir + "/example.yaml"
	text := strings.Replace(string(b), "/etc/ssl/extra-ca.pem", dir+"/missing-ca.pem", 1)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	fes := fieldErrors(err)
	if len(fes) != 1 || fes[0].Path != "registries[0].caFile" || fes[0].Line != 17 {
		t.Errorf("want one caFile error at line 17, got %v", err)
	}
}

func TestLoad_AMissingFileIsAnError(t *testing.T) {
	if _, err := Load(t.TempDir() + "/nope.yaml"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load of a missing file: %v", err)
	}
}

func TestGroup_WorkloadsListsTheAnchorThenEachTargetWorkloadOnce(t *testing.T) {
	g := validConfig().Groups[0]
	want := []Workload{
		{Kind: KindDeployment, Namespace: "tb", Name: "tb-jobs-manager"},
		{Kind: KindDeployment, Namespace: "tb", Name: "tb-requests-proxy"},
		{Kind: KindDaemonSet, Namespace: "tb", Name: "tb-resource-monitor"},
	}
	if got := g.Workloads(); !reflect.DeepEqual(got, want) {
		t.Errorf("Workloads = %v, want %v", got, want)
	}
}

func TestConfig_LookupsFindGroupsAndRegistries(t *testing.T) {
	c := validConfig(func(c *Config) {
		c.Registries = []Registry{{Host: "docker.io", CAFile: "/ca.pem"}, {Host: "127.0.0.1:5000", Insecure: true}}
	})
	if g, ok := c.Group("control-plane"); !ok || g != &c.Groups[0] {
		t.Errorf("Group(control-plane) = %v, %v", g, ok)
	}
	if _, ok := c.Group("nope"); ok {
		t.Errorf("Group(nope) found a group")
	}
	if r, ok := c.RegistryFor("index.docker.io"); !ok || r.CAFile != "/ca.pem" {
		t.Errorf("RegistryFor(index.docker.io) = %v, %v: docker.io names the same registry", r, ok)
	}
	if r, ok := c.RegistryFor("127.0.0.1:5000"); !ok || !r.Insecure {
		t.Errorf("RegistryFor(127.0.0.1:5000) = %v, %v", r, ok)
	}
	if _, ok := c.RegistryFor("ghcr.io"); ok {
		t.Errorf("RegistryFor(ghcr.io) found a registry")
	}
}

func TestConfig_EffectiveTickTimeoutIsDerivedFromTheTargetWorkloadsWhenZero(t *testing.T) {
	c := validConfig()
	// 3 distinct target workloads: (3+1) * 10m + 2m.
	if got, want := c.EffectiveTickTimeout(), 42*time.Minute; got != want {
		t.Errorf("derived EffectiveTickTimeout = %s, want %s", got, want)
	}
	c.TickTimeout = 5 * time.Minute
	if got := c.EffectiveTickTimeout(); got != 5*time.Minute {
		t.Errorf("explicit EffectiveTickTimeout = %s, want 5m", got)
	}
	c.TickTimeout, c.RolloutTimeout = 0, time.Duration(1<<62)
	if got := c.EffectiveTickTimeout(); got <= 0 {
		t.Errorf("a huge rolloutTimeout overflowed the tick deadline to %s", got)
	}
}

func TestStrings_NameWorkloadsAndTargetsForMessages(t *testing.T) {
	tg := Target{Kind: KindDeployment, Namespace: "tb", Name: "tb-jobs-manager", Container: "api"}
	if got := tg.Workload().String(); got != "Deployment tb/tb-jobs-manager" {
		t.Errorf("Workload.String = %q", got)
	}
	if got := tg.String(); got != "Deployment tb/tb-jobs-manager container api" {
		t.Errorf("Target.String = %q", got)
	}
}

func TestPinFormat_D1_ADiscoveredGroupKeepsTheTag(t *testing.T) {
	if got := (Group{Name: "shop/deployment/api", Discovered: true}).PinFormat(imageref.PinDigest); got != imageref.PinTagAndDigest {
		t.Errorf("a discovered group pins as %s, want %s", got, imageref.PinTagAndDigest)
	}
	if got := (Group{Name: "web"}).PinFormat(imageref.PinDigest); got != imageref.PinDigest {
		t.Errorf("a configured group pins as %s, want the config's %s", got, imageref.PinDigest)
	}
}
