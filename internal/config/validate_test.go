package config

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/image-refresh/image-refresh/internal/state"
)

// digest is a valid sha256 digest for fixtures.
var digest = "sha256:" + strings.Repeat("0123456789abcdef", 4)

func TestValidate_RejectsEveryInvalidSetting(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		// want are substrings of the error, the first one the field path.
		want []string
	}{
		{"an annotation prefix that is not a DNS subdomain is rejected",
			func(c *Config) { c.AnnotationPrefix = "Image_Refresh" }, []string{"annotationPrefix:", "DNS subdomain"}},
		{"an empty annotation prefix is rejected",
			func(c *Config) { c.AnnotationPrefix = "" }, []string{"annotationPrefix: missing"}},
		{"a zero rollout timeout is rejected",
			func(c *Config) { c.RolloutTimeout = 0 }, []string{"rolloutTimeout: must be positive"}},
		{"a zero registry timeout is rejected",
			func(c *Config) { c.RegistryTimeout = 0 }, []string{"registryTimeout: must be positive"}},
		{"a negative API timeout is rejected",
			func(c *Config) { c.APITimeout = -time.Second }, []string{"apiTimeout: must be positive"}},
		{"a negative tick timeout is rejected",
			func(c *Config) { c.TickTimeout = -time.Second }, []string{"tickTimeout: must not be negative"}},
		{"zero refresh attempts are rejected",
			func(c *Config) { c.MaxRefreshAttempts = 0 }, []string{"maxRefreshAttempts: must be at least 1"}},
		{"zero skip ticks are rejected",
			func(c *Config) { c.MaxSkipTicks = 0 }, []string{"maxSkipTicks: must be at least 1"}},
		{"negative read failures are rejected",
			func(c *Config) { c.MaxReadFailures = -1 }, []string{"maxReadFailures: must be at least 1"}},
		{"zero digest changes are rejected",
			func(c *Config) { c.MaxDigestChanges = 0 }, []string{"maxDigestChanges: must be at least 1"}},
		{"a negative digest change window is rejected",
			func(c *Config) { c.DigestChangeWindow = -time.Minute }, []string{"digestChangeWindow: must not be negative", "0 turns the bound off"}},
		{"V4: a zero pinCheckInterval is rejected",
			func(c *Config) { c.PinCheckInterval = 0 }, []string{"pinCheckInterval: must be positive"}},
		{"R22: a negative minDigestAge is rejected",
			func(c *Config) { c.MinDigestAge = -time.Minute }, []string{"minDigestAge: must not be negative", "0 rolls a new digest at once"}},
		{"R24: a negative maxConcurrentRollouts is rejected",
			func(c *Config) { c.MaxConcurrentRollouts = -1 }, []string{"maxConcurrentRollouts: must not be negative", "0 is unlimited"}},
		{"R24: a rollout window with an unknown weekday is rejected naming the field",
			func(c *Config) {
				c.RolloutWindows = []RolloutWindow{{Days: []string{"Mon", "Funday"}, Start: "22:00", End: "06:00"}}
			}, []string{"rolloutWindows[0].days[1]: \"Funday\" is not a weekday"}},
		{"R24: a rollout window with a bad time is rejected naming the field",
			func(c *Config) {
				c.RolloutWindows = []RolloutWindow{{Days: []string{"Mon"}, Start: "22:00", End: "6pm"}}
			}, []string{"rolloutWindows[0].end: invalid time \"6pm\""}},
		{"R24: an empty rollout window is rejected",
			func(c *Config) {
				c.RolloutWindows = []RolloutWindow{{Days: []string{"Mon"}, Start: "10:00", End: "10:00"}}
			}, []string{"rolloutWindows[0].end: equals start"}},
		{"R24: a rollout window without days is rejected",
			func(c *Config) { c.RolloutWindows = []RolloutWindow{{Start: "10:00", End: "12:00"}} }, []string{"rolloutWindows[0].days: at least one weekday"}},
		{"an unknown firstInstall is rejected with the allowed values",
			func(c *Config) { c.FirstInstall = "always" }, []string{"firstInstall:", "pin-next-tick, only-after-ever-pinned"}},
		{"an unknown pinFormat is rejected with the allowed values",
			func(c *Config) { c.PinFormat = "sha" }, []string{"pinFormat:", "tag+digest, digest"}},
		{"a group without a name is rejected",
			func(c *Config) { c.Groups[0].Name = "" }, []string{"groups[0].name: missing"}},
		{"a group name that is not a DNS-1123 label is rejected",
			func(c *Config) { c.Groups[0].Name = "Control_Plane" }, []string{"groups[0].name:", "DNS-1123 label"}},
		{"two groups with one name are rejected",
			func(c *Config) { c.Groups = append(c.Groups, otherGroup(c.Groups[0].Name)) }, []string{"groups[1].name: duplicate group name"}},
		{"an anchor without a kind is rejected",
			func(c *Config) { c.Groups[0].Anchor.Kind = "" }, []string{"groups[0].anchor.kind: missing"}},
		{"an anchor of an unsupported kind is rejected",
			func(c *Config) { c.Groups[0].Anchor.Kind = "Pod" }, []string{"groups[0].anchor.kind:", "Deployment, DaemonSet, StatefulSet, CronJob"}},
		{"an anchor without a namespace is rejected",
			func(c *Config) { c.Groups[0].Anchor.Namespace = "" }, []string{"groups[0].anchor.namespace: missing"}},
		{"an anchor namespace that is not a DNS-1123 label is rejected",
			func(c *Config) { c.Groups[0].Anchor.Namespace = "TB" }, []string{"groups[0].anchor.namespace:", "DNS-1123 label"}},
		{"an anchor without a name is rejected",
			func(c *Config) { c.Groups[0].Anchor.Name = "" }, []string{"groups[0].anchor.name: missing"}},
		{"an anchor name that is not a DNS-1123 subdomain is rejected",
			func(c *Config) { c.Groups[0].Anchor.Name = "jobs manager" }, []string{"groups[0].anchor.name:", "DNS-1123 subdomain"}},
		{"two groups on one anchor are rejected, since they would share the group keys",
			func(c *Config) {
				g := otherGroup("other")
				g.Anchor = c.Groups[0].Anchor
				c.Groups = append(c.Groups, g)
			}, []string{"groups[1].anchor:", "already the anchor of groups[0]", "refresh-attempt"}},
		{"a group without images is rejected",
			func(c *Config) { c.Groups[0].Images = nil }, []string{"groups[0].images: at least one image is required"}},
		{"an image without a name is rejected",
			func(c *Config) { c.Groups[0].Images[1].Name = "" }, []string{"groups[0].images[1].name: missing"}},
		{"an image name that is not a DNS-1123 label is rejected",
			func(c *Config) { c.Groups[0].Images[1].Name = "Monitor.v2" }, []string{"groups[0].images[1].name:", "DNS-1123 label"}},
		{"an image name too long for its longest annotation key is rejected",
			func(c *Config) { c.Groups[0].Images[1].Name = strings.Repeat("a", 39) },
			[]string{"groups[0].images[1].name:", "live-read-failure-streak-", "63"}},
		{"two images with one name in a group are rejected",
			func(c *Config) { c.Groups[0].Images[1].Name = "jobs-manager" }, []string{"groups[0].images[1].name: duplicate image name"}},
		{"an image without a repository is rejected",
			func(c *Config) { c.Groups[0].Images[1].Repository = "" }, []string{"groups[0].images[1].repository: missing"}},
		{"an invalid repository is rejected",
			func(c *Config) { c.Groups[0].Images[1].Repository = "acme/API" }, []string{"groups[0].images[1].repository: invalid"}},
		{"a repository with a tag is rejected",
			func(c *Config) { c.Groups[0].Images[1].Repository = "acme/api:prod" }, []string{"groups[0].images[1].repository: invalid"}},
		{"an image without a tag is rejected",
			func(c *Config) { c.Groups[0].Images[1].Tag = "" }, []string{"groups[0].images[1].tag: missing"}},
		{"an invalid tag is rejected",
			func(c *Config) { c.Groups[0].Images[1].Tag = "-prod" }, []string{"groups[0].images[1].tag:", "not a valid tag"}},
		{"a tag starting with a dot is rejected",
			func(c *Config) { c.Groups[0].Images[1].Tag = ".prod" }, []string{"groups[0].images[1].tag:", "not a valid tag"}},
		{"a tag with a colon is rejected",
			func(c *Config) { c.Groups[0].Images[1].Tag = "a:b" }, []string{"groups[0].images[1].tag:", "not a valid tag"}},
		{"a tag with a digest is rejected and points at pinnedDigest",
			func(c *Config) { c.Groups[0].Images[1].Tag = "prod@" + digest }, []string{"groups[0].images[1].tag:", "must not contain '@'", "pinnedDigest"}},
		{"a pinned digest that is not a digest is rejected",
			func(c *Config) { c.Groups[0].Images[1].PinnedDigest = "sha256:abc" }, []string{"groups[0].images[1].pinnedDigest:", "invalid digest"}},
		{"a pinned digest in upper case is rejected",
			func(c *Config) { c.Groups[0].Images[1].PinnedDigest = strings.ToUpper(digest) }, []string{"groups[0].images[1].pinnedDigest:"}},
		{"an image without targets is rejected",
			func(c *Config) { c.Groups[0].Images[1].Targets = nil }, []string{"groups[0].images[1].targets: at least one target is required"}},
		{"a target of an unsupported kind is rejected with the supported kinds",
			func(c *Config) { c.Groups[0].Images[0].Targets[1].Kind = "Job" },
			[]string{"groups[0].images[0].targets[1].kind:", "Deployment, DaemonSet, StatefulSet, CronJob"}},
		{"a target whose namespace is not a DNS-1123 label is rejected",
			func(c *Config) { c.Groups[0].Images[0].Targets[1].Namespace = "t.b" }, []string{"groups[0].images[0].targets[1].namespace:"}},
		{"a target whose name is not a DNS-1123 subdomain is rejected",
			func(c *Config) { c.Groups[0].Images[0].Targets[1].Name = "Proxy" }, []string{"groups[0].images[0].targets[1].name:"}},
		{"a target without a container is rejected",
			func(c *Config) { c.Groups[0].Images[0].Targets[1].Container = "" }, []string{"groups[0].images[0].targets[1].container: missing"}},
		{"a container name that is not a DNS-1123 label is rejected",
			func(c *Config) { c.Groups[0].Images[0].Targets[1].Container = "API_1" }, []string{"groups[0].images[0].targets[1].container:", "DNS-1123 label"}},
		{"a target listed twice in one image is rejected",
			func(c *Config) {
				img := &c.Groups[0].Images[0]
				img.Targets = append(img.Targets, img.Targets[0])
			}, []string{"groups[0].images[0].targets[2]: duplicate of targets[0]"}},
		{"a target listed under two images of one group is rejected",
			func(c *Config) { c.Groups[0].Images[1].Targets[0] = c.Groups[0].Images[0].Targets[1] },
			[]string{"groups[0].images[1].targets[0]:", "also a target of groups[0].images[0]"}},
		{"a target listed under images of two groups is rejected",
			func(c *Config) {
				g := otherGroup("other")
				g.Images[0].Targets[0] = c.Groups[0].Images[0].Targets[0]
				c.Groups = append(c.Groups, g)
			}, []string{"groups[1].images[0].targets[0]:", "also a target of groups[0].images[0]"}},
		{"a registry without a host is rejected",
			func(c *Config) { c.Registries = []Registry{{Insecure: true}} }, []string{"registries[0].host: missing"}},
		{"a registry host that an image reference would read as a namespace is rejected",
			func(c *Config) { c.Registries = []Registry{{Host: "myregistry"}} }, []string{"registries[0].host:", "not a registry host"}},
		{"a registry host with a path is rejected",
			func(c *Config) { c.Registries = []Registry{{Host: "https://ghcr.io"}} }, []string{"registries[0].host:", "not a registry host"}},
		{"two registries for one host are rejected, docker.io being index.docker.io",
			func(c *Config) { c.Registries = []Registry{{Host: "index.docker.io"}, {Host: "docker.io"}} },
			[]string{"registries[1].host: duplicate registry host"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig(tt.mod)
			// Validate on the Config built in code, and Parse on the same
			// config as a file: both must name the field.
			vErr := c.Validate()
			parsed, pErr := Parse(marshal(t, c), "bad.yaml")
			if parsed != nil {
				t.Errorf("Parse returned a config with an error")
			}
			for _, err := range []error{vErr, pErr} {
				if err == nil {
					t.Fatalf("no error, want one containing %q", tt.want)
				}
				for _, w := range tt.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error does not contain %q:\n%v", w, err)
					}
				}
			}
			fes := fieldErrors(pErr)
			if len(fes) != 1 {
				t.Errorf("want exactly one problem, got %d:\n%v", len(fes), pErr)
			}
			for _, fe := range fes {
				if fe.Line == 0 && fe.Path != "groups" {
					t.Errorf("Parse error has no line: %v", fe)
				}
			}
		})
	}
}

// otherGroup is a valid group with its own anchor, image and target.
func otherGroup(name string) Group {
	return Group{
		Name:   name,
		Anchor: Workload{Kind: KindStatefulSet, Namespace: "other", Name: "db"},
		Images: []Image{{
			Name: "db", Repository: "ghcr.io/acme/db", Tag: "16", PinnedDigest: digest,
			Targets: []Target{{Kind: KindStatefulSet, Namespace: "other", Name: "db", Container: "db"}},
		}},
	}
}

func TestValidate_AcceptsTheLongestImageNameThatFitsEveryKey(t *testing.T) {
	// "live-read-failure-streak-" is 25 characters: 25 + 38 = 63.
	c := validConfig(func(c *Config) { c.Groups[0].Images[1].Name = strings.Repeat("a", 38) })
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	for _, k := range state.ImageKeyNames(strings.Repeat("a", 38)) {
		if len(k) > 63 {
			t.Errorf("key name part %q is %d characters", k, len(k))
		}
	}
}

func TestValidate_AcceptsTwoGroupsWithOwnAnchors(t *testing.T) {
	c := validConfig(func(c *Config) { c.Groups = append(c.Groups, otherGroup("other")) })
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if err := (*Config)(nil).Validate(); err == nil {
		t.Errorf("Validate of a nil config passed")
	}
}

func TestValidate_TwoGroupsOnOneAnchorWithOneImageNameAreRejectedAtTheAnchorAndTheImage(t *testing.T) {
	c := validConfig(func(c *Config) {
		g := otherGroup("other")
		g.Anchor = c.Groups[0].Anchor
		g.Images[0].Name = "jobs-manager"
		c.Groups = append(c.Groups, g)
	})
	_, err := Parse(marshal(t, c), "bad.yaml")
	var paths []string
	for _, fe := range fieldErrors(err) {
		paths = append(paths, fe.Path)
	}
	if want := []string{"groups[1].anchor", "groups[1].images[0].name"}; !slices.Equal(paths, want) {
		t.Errorf("problems at %v, want %v:\n%v", paths, want, err)
	}
	if err == nil || !strings.Contains(err.Error(), "annotation keys would collide") {
		t.Errorf("error does not explain the collision: %v", err)
	}
}
