package config

import (
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
			[]string{`groups[0].promotion: unknown key "afterr" (known keys: after, soak)`}},
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
