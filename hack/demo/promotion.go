package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// The two Deployments of step 9 on the real node: one application, run in
// staging and in production, each its own group of a config of its own.
var (
	webStaging = target{"Deployment", "web-staging", "app", "web"}
	webProd    = target{"Deployment", "web-prod", "app", "web"}
)

// promotionSoak is step 9's soak: short, so that the story fits a demo.
const promotionSoak = 5 * time.Second

// soakEnds finds the moment a follower's waiting line says it moves.
var soakEnds = regexp.MustCompile(`it moves here after the soak of \S+, in \S+ \(at (\S+)\)`)

// 9. P1 on the real node: production follows staging. A build that
// crashes in staging is rolled back there and never reaches production; a
// good one reaches production once it ran healthy in staging for the soak.
func (d *demo) stepPromotion() {
	d.step(9, nSteps, "Staging first: a crashing build stops there, a good one is promoted after its soak")
	if d.cluster.Real == nil {
		d.say("skipped: `make demo REAL_NODES=0` started no real node.")
		return
	}
	cfg := filepath.Join(d.work, "web.yaml")
	repo := d.nodeRepo(webStaging.image)
	group := func(name, extra string, t target) string {
		return fmt.Sprintf(`  - name: %s
    onFailedRollout: rollback
%s    anchor: {kind: Deployment, namespace: %s, name: %s}
    images:
      - name: app
        repository: %s
        tag: %s
        targets:
          - {kind: Deployment, namespace: %s, name: %s, container: app}
`, name, extra, namespace, t.name, repo, tag, namespace, t.name)
	}
	text := fmt.Sprintf("annotationPrefix: %s\nrolloutTimeout: 20s\nregistries:\n  - {host: \"%s\", insecure: true}\ngroups:\n", prefix, d.nodeReg) +
		group("staging", "", webStaging) +
		group("production", fmt.Sprintf("    promotion: {after: staging, soak: %s}\n", promotionSoak), webProd)
	d.must(os.WriteFile(cfg, []byte(text), 0o644), "write "+cfg)
	d.say("One application, web, in staging and in production: two groups of a config of its own (%s);", filepath.Base(cfg))
	d.say("production follows staging (promotion: {after: staging, soak: %s}, docs/promotion.md):", promotionSoak)
	for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n")[4:] {
		d.line("       ", l)
	}

	d.say("Build A runs in both; the first tick records it (R5), the next pins both (R7):")
	a := d.pushBuild(webStaging.image, "A")
	d.createApp(webStaging, repo+":"+tag)
	d.createApp(webProd, repo+":"+tag)
	d.appPod(webStaging)
	d.appPod(webProd)
	d.tickWith(cfg, 0)
	d.tickWith(cfg, 0)
	d.appPod(webStaging)
	d.appPod(webProd)
	d.wantImage(webStaging, repo+":"+tag+"@"+a)
	d.wantImage(webProd, repo+":"+tag+"@"+a)
	d.ok("staging and production are pinned to build A")

	d.say("Build C is pushed; its container exits 1 at once. Staging tries it first:")
	c := d.pushCrashing(webStaging.image, "C")
	logs := d.tickWith(cfg, 1)
	if !strings.Contains(logs, "rolled back to the recorded digest "+a) {
		d.failf("the tick does not say it rolled staging back from C to A")
	}
	d.wantImage(webStaging, repo+":"+tag+"@"+a)
	d.wantImage(webProd, repo+":"+tag+"@"+a)
	d.ok("staging rolled C back to A (V2); production never asked for C")
	code, out, _ := d.imageRefresh("status", "--config", cfg)
	if code != 0 {
		d.failf("status exited %d", code)
	}
	row := statusRow(out, webProd.name+"/"+webProd.container)
	if !strings.Contains(row, "quarantined") || !strings.Contains(out, "staging") || !strings.Contains(out, c) {
		d.failf("status does not say production holds C because staging rolled it back:\n%s", out)
	}
	d.ok("status: production is quarantined on C, naming staging's rollback")

	d.say("Build B is pushed; it runs. Staging moves at once, production waits for the soak:")
	b := d.pushBuild(webStaging.image, "B")
	d.tickWith(cfg, 0)
	d.appPod(webStaging)
	d.wantImage(webStaging, repo+":"+tag+"@"+b)
	d.wantImage(webProd, repo+":"+tag+"@"+a)
	// The soak clock starts on the first pass that finds staging settled
	// and healthy on B: in a CronJob, the next tick.
	logs = d.tickWith(cfg, 0)
	m := soakEnds.FindStringSubmatch(logs)
	if m == nil {
		d.failf("the tick does not say when production moves to %s", short(b))
	}
	at, err := time.Parse(time.RFC3339, m[1])
	d.must(err, "read the end of the soak")
	d.wantImage(webProd, repo+":"+tag+"@"+a)
	d.ok("production waits: staging runs B settled and healthy; production moves at %s", m[1])
	d.say("(a CronJob's next tick; here the demo waits for the soak to end)")
	select {
	case <-time.After(time.Until(at) + time.Second):
	case <-d.ctx.Done():
		d.failf("interrupted")
	}
	d.tickWith(cfg, 0)
	d.appPod(webProd)
	d.wantImage(webProd, repo+":"+tag+"@"+b)
	d.ok("production runs B: it ran healthy in staging for %s first; C never reached it", promotionSoak)
}
