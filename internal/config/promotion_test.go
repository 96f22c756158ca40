package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// stage is a group on namespace ns with the seed's image, following after
// (P1) when after is not "".
func stage(name, ns, after, soak, repo string) string {
	s := `  - name: ` + name + `
    anchor: {kind: Deployment, namespace: ` + ns + `, name: api}
    images:
      - name: api
        repository: ` + repo + `
        tag: prod
        targets:
          - {kind: Deployment, namespace: ` + ns + `, name: api, container: api}
`
	if after != "" {
		s += "    promotion: {after: " + after + ", soak: " + soak + "}\n"
	}
	return s
}

func TestParse_P1_AFollowerNamesItsLeaderAndItsImagesMapToTheLeaders(t *testing.T) {
	c, err := Parse([]byte("groups:\n"+
		stage("prod", "prod", "staging", "30m", "docker.io/acme/api")+
		stage("staging", "staging", "dev", "0s", "acme/api")+
		stage("dev", "dev", "", "", "index.docker.io/acme/api")), "p1.yaml")
	if err != nil {
		t.Fatal(err)
	}
	prod, _ := c.Group("prod")
	if prod.Promotion == nil || prod.Promotion.After != "staging" || prod.Promotion.Soak != 30*time.Minute || prod.Promotion.Images["api"] != "api" {
		t.Errorf("prod's promotion = %+v, want after staging, soak 30m, api → api", prod.Promotion)
	}
	if got := c.Followers("staging"); !slices.Equal(got, []string{"prod"}) {
		t.Errorf("Followers(staging) = %v, want [prod]", got)
	}
	var order []string
	for _, g := range PromotionOrder(c.Groups) {
		order = append(order, g.Name)
	}
	if want := []string{"dev", "staging", "prod"}; !slices.Equal(order, want) {
		t.Errorf("PromotionOrder = %v, want every leader first: %v", order, want)
	}
}

func TestParse_P1_CyclesUnknownLeadersAndMissingImagesAreConfigErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		yaml string
		want []string // the field path first
	}{
		"an unknown leader": {
			stage("prod", "prod", "stagin", "30m", "acme/api") + stage("staging", "staging", "", "", "acme/api"),
			[]string{"groups[0].promotion.after", `names no group of this config: "stagin" (groups are prod, staging)`}},
		"a group following itself": {
			stage("prod", "prod", "prod", "30m", "acme/api"),
			[]string{"groups[0].promotion.after", `group "prod" cannot follow itself`}},
		"a cycle": {
			stage("a", "a", "b", "1m", "acme/api") + stage("b", "b", "c", "1m", "acme/api") + stage("c", "c", "a", "1m", "acme/api"),
			[]string{"groups[0].promotion.after", "promotion cycle: a → b → c → a"}},
		"an image the leader lacks": {
			stage("prod", "prod", "staging", "30m", "acme/worker") + stage("staging", "staging", "", "", "acme/api"),
			[]string{"groups[0].images[0]", `acme/worker:prod is not an image of group "staging"`}},
		"a negative soak": {
			stage("prod", "prod", "staging", "-1m", "acme/api") + stage("staging", "staging", "", "", "acme/api"),
			[]string{"groups[0].promotion.soak", "must not be negative"}},
		"no leader": {
			stage("staging", "staging", "", "", "acme/api") + "    promotion: {soak: 1m}\n",
			[]string{"groups[0].promotion.after", "is required"}},
		"an unknown field": {
			stage("staging", "staging", "", "", "acme/api") + "    promotion: {afterr: x}\n",
			[]string{`groups[0].promotion: unknown key "afterr" (known keys: after, attestedBy, publish, soak)`}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte("groups:\n"+tc.yaml), "bad.yaml")
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

// P2: a publishing leader names its installation and key; a follower of
// another cluster names its signer and trust, from which validation
// derives the one attestation it requires (the project's predicate type,
// naming the installation); Load reads the files.
func TestLoad_P2_PublisherAndCrossClusterFollowerAreRead(t *testing.T) {
	dir := t.TempDir()
	pub := writeKey(t, dir, "staging.pub")
	keyFile := filepath.Join(dir, "promotion.key")
	if err := os.WriteFile(keyFile, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := writeConfig(t, dir, "installation: staging-eu\npromotionSigning: {keyFile: "+keyFile+"}\ngroups:\n"+
		stage("staging", "staging", "", "", "acme/api")+"    promotion: {publish: {soak: 30m}}\n"+
		stage("prod", "prod", "", "", "acme/api")+"    promotion: {attestedBy: {name: staging-eu, cosign: {publicKeys: ["+pub+"]}}, soak: 5m}\n")
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Installation != "staging-eu" || c.PromotionSigning == nil || len(c.PromotionSigning.Key) == 0 {
		t.Errorf("installation %q, signing %+v: want staging-eu and the key read", c.Installation, c.PromotionSigning)
	}
	staging, _ := c.Group("staging")
	if staging.Promotion.Publish == nil || staging.Promotion.Publish.Soak != 30*time.Minute || !c.Publishes() {
		t.Errorf("staging's publish = %+v, want soak 30m", staging.Promotion.Publish)
	}
	prod, _ := c.Group("prod")
	a := prod.Promotion.AttestedBy
	if a == nil || a.Name != "staging-eu" || prod.Promotion.Soak != 5*time.Minute || a.Policy == nil || len(a.Cosign.Keys) != 1 {
		t.Fatalf("prod's attestedBy = %+v, want staging-eu with one key read and a derived policy", a)
	}
	want := AttestationPolicy{PredicateType: PromotionPredicateType, Conditions: []string{`predicate.installation == "staging-eu"`}}
	if len(a.Policy.Attestations) != 1 || a.Policy.Attestations[0].PredicateType != want.PredicateType || !slices.Equal(a.Policy.Attestations[0].Conditions, want.Conditions) {
		t.Errorf("derived policy requires %+v, want %+v", a.Policy.Attestations, want)
	}
	if len(c.Followers("staging")) != 0 {
		t.Errorf("a cross-cluster follower is no follower of a group of this config: %v", c.Followers("staging"))
	}
}

func TestParse_P2_BadPromotionSettingsAreConfigErrorsNamingTheField(t *testing.T) {
	follower := stage("prod", "prod", "", "", "acme/api")
	for name, tc := range map[string]struct {
		yaml string
		want []string
	}{
		"after and attestedBy": {
			stage("staging", "staging", "", "", "acme/api") + follower + "    promotion: {after: staging, attestedBy: {name: staging, cosign: {publicKeys: [k.pub]}}}\n",
			[]string{"groups[1].promotion.attestedBy", "after and attestedBy are exclusive"}},
		"a signer without a name": {
			follower + "    promotion: {attestedBy: {cosign: {publicKeys: [k.pub]}}}\n",
			[]string{"groups[0].promotion.attestedBy.name", "missing"}},
		"a signer whose name is no label": {
			follower + "    promotion: {attestedBy: {name: Staging_EU, cosign: {publicKeys: [k.pub]}}}\n",
			[]string{"groups[0].promotion.attestedBy.name", `"Staging_EU" is not a valid installation name`}},
		"a signer without trust": {
			follower + "    promotion: {attestedBy: {name: staging}}\n",
			[]string{"groups[0].promotion.attestedBy.cosign", "missing: the public keys"}},
		"a signer with empty trust": {
			follower + "    promotion: {attestedBy: {name: staging, cosign: {}}}\n",
			[]string{"groups[0].promotion.attestedBy.cosign", "give cosign.publicKeys"}},
		"a keyless signer without an issuer": {
			follower + "    promotion: {attestedBy: {name: staging, cosign: {keyless: [{subject: a@b.c}]}}}\n",
			[]string{"groups[0].promotion.attestedBy.cosign.keyless[0].issuer", "missing"}},
		"publish without a key": {
			"installation: staging\n" + "groups:\n" + follower + "    promotion: {publish: {soak: 1m}}\n",
			[]string{"groups[0].promotion.publish", "give the top-level installation"}},
		"a negative publish soak": {
			"installation: staging\npromotionSigning: {keyFile: k}\ngroups:\n" + follower + "    promotion: {publish: {soak: -1m}}\n",
			[]string{"groups[0].promotion.publish.soak", "must not be negative"}},
		"a soak without anything to follow": {
			"installation: staging\npromotionSigning: {keyFile: k}\ngroups:\n" + follower + "    promotion: {publish: {soak: 1m}, soak: 1m}\n",
			[]string{"groups[0].promotion.soak", "give after or attestedBy"}},
		"a key without an installation": {
			"promotionSigning: {keyFile: k}\ngroups:\n" + follower,
			[]string{"promotionSigning", "give installation too"}},
		"a key without a file": {
			"installation: staging\npromotionSigning: {passwordFile: p}\ngroups:\n" + follower,
			[]string{"promotionSigning.keyFile", "missing"}},
		"an installation that is no label": {
			"installation: Staging.EU\ngroups:\n" + follower,
			[]string{"installation", `"Staging.EU" is not a valid installation name`}},
		"an unknown key under attestedBy": {
			follower + "    promotion: {attestedBy: {name: staging, key: x}}\n",
			[]string{`groups[0].promotion.attestedBy: unknown key "key"`}},
	} {
		t.Run(name, func(t *testing.T) {
			body := tc.yaml
			if !strings.HasPrefix(body, "installation") && !strings.HasPrefix(body, "promotionSigning") {
				body = "groups:\n" + body
			}
			_, err := Parse([]byte(body), "bad.yaml")
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

// P2: Load names the signing key file it cannot read, and a key file
// that holds no PEM.
func TestLoad_P2_AnUnreadableSigningKeyIsAnErrorAtItsField(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "key.txt")
	if err := os.WriteFile(notPEM, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, want string }{
		{filepath.Join(dir, "missing.key"), "cannot read the signing key"},
		{notPEM, "holds no PEM block"},
	} {
		path := writeConfig(t, dir, "installation: staging\npromotionSigning: {keyFile: "+tc.file+"}\ngroups:\n"+stage("s", "s", "", "", "acme/api"))
		_, err := Load(path)
		if err == nil || !strings.Contains(err.Error(), "promotionSigning.keyFile") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Load with keyFile %s = %v, want an error at promotionSigning.keyFile saying %q", tc.file, err, tc.want)
		}
	}
}
