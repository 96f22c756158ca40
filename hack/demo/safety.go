package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/image-refresh/image-refresh/test/support/content"
	"github.com/image-refresh/image-refresh/test/support/localcluster"
	"github.com/image-refresh/image-refresh/test/support/testsign"
)

// checkout is step 8's workload on the real node: configured (not
// labelled) in a config of its own, under a verification policy and
// onFailedRollout: rollback.
var checkout = target{"Deployment", "checkout", "app", "checkout"}

// 8. V1, V5, V2 and V3 on the real node: an unsigned push is held, a
// signed push whose scan attestation reports criticals is held, a signed
// and scanned build that crashes is rolled back, and a signed index
// without the node's platform is held.
func (d *demo) stepSafety() {
	d.step(8, nSteps, "Only signed, clean-scanned builds the nodes can run move, and a broken one is rolled back")
	if d.cluster.Real == nil {
		d.say("skipped: `make demo REAL_NODES=0` started no real node.")
		return
	}
	key, err := testsign.NewKeyPair("release.pub")
	d.must(err, "make the release key")
	pub, err := key.PublicKeyPEM()
	d.must(err, "the release key's public half")
	keyFile := filepath.Join(d.work, "release.pub")
	d.must(os.WriteFile(keyFile, pub, 0o600), "write "+keyFile)
	cfg := filepath.Join(d.work, "checkout.yaml")
	repo := d.nodeRepo(checkout.image)
	d.must(os.WriteFile(cfg, []byte(fmt.Sprintf(`annotationPrefix: %s
rolloutTimeout: 20s
registries:
  - {host: "%s", insecure: true}
verification:
  - name: release
    repositories: ["%s"]
    cosign: {publicKeys: [%s]}
    attestations:
      - predicateType: %s
        conditions: ['%s']
groups:
  - name: checkout
    onFailedRollout: rollback
    anchor: {kind: Deployment, namespace: %s, name: checkout}
    images:
      - name: app
        repository: %s
        tag: %s
        targets:
          - {kind: Deployment, namespace: %s, name: checkout, container: app}
`, prefix, d.nodeReg, repo, keyFile, testsign.VulnPredicate, noCriticals, namespace, repo, tag, namespace)), 0o644), "write "+cfg)
	d.say("A config of its own (%s): only builds signed with release.pub (a cosign key made now), with a signed", filepath.Base(cfg))
	d.say("vulnerability scan that found no critical (%s), move,", noCriticals)
	d.say("and a rollout that fails is rolled back (onFailedRollout: rollback). Build A, signed and scanned clean:")
	a := d.pushBuild(checkout.image, "A")
	d.sign(key, repo, a)
	d.scan(key, repo, a, 0)
	d.createApp(checkout, repo+":"+tag)
	d.appPod(checkout)
	d.tickWith(cfg, 0)
	d.tickWith(cfg, 0)
	d.appPod(checkout)
	d.wantImage(checkout, repo+":"+tag+"@"+a)
	d.ok("checkout is pinned to the signed build A")

	d.say("Build B is pushed without a signature:")
	b := d.pushBuild(checkout.image, "B")
	logs := d.tickWith(cfg, 1)
	if !strings.Contains(logs, b) || !strings.Contains(logs, "no signature found") {
		d.failf("the tick does not say %s has no signature", short(b))
	}
	d.wantImage(checkout, repo+":"+tag+"@"+a)
	d.ok("held: B did not verify (no signature found), checkout stays on A; exit 1 and an Event say so")

	d.say("Build D is signed, but its signed scan found 2 criticals:")
	dd := d.pushBuild(checkout.image, "D")
	d.sign(key, repo, dd)
	d.scan(key, repo, dd, 2)
	logs = d.tickWith(cfg, 1)
	if !strings.Contains(logs, dd) || !strings.Contains(logs, "condition-failed") || !strings.Contains(logs, noCriticals) {
		d.failf("the tick does not say %s's scan failed its condition", short(dd))
	}
	d.wantImage(checkout, repo+":"+tag+"@"+a)
	d.ok("held: D's scan attestation fails %q, checkout stays on A", noCriticals)

	d.say("Build C is signed, but its container exits 1 at once:")
	c := d.pushCrashing(checkout.image, "C")
	d.sign(key, repo, c)
	d.scan(key, repo, c, 0)
	logs = d.tickWith(cfg, 1)
	if !strings.Contains(logs, "rolled back to the recorded digest "+a) {
		d.failf("the tick does not say it rolled C back to A")
	}
	d.wantImage(checkout, repo+":"+tag+"@"+a)
	dep, err := d.kube.AppsV1().Deployments(namespace).Get(d.ctx, checkout.name, metav1.GetOptions{})
	d.must(err, "read Deployment checkout")
	if got := dep.Annotations[prefix+"/locked-on-app"]; got != c {
		d.failf("C is not quarantined (locked-on-app %q)", got)
	}
	d.appPod(checkout)
	d.ok("C's pods never became Ready: rolled back to A within one tick, C quarantined (never tried again by itself)")

	d.say("Build E is signed and scanned clean, but CI dropped linux/amd64: its index holds only linux/arm64, and %s runs linux/amd64:", d.cluster.RealNodeName())
	e := d.pushArm64Only(checkout.image, "E")
	d.sign(key, repo, e)
	d.scan(key, repo, e, 0)
	logs = d.tickWith(cfg, 1)
	if !strings.Contains(logs, e) || !strings.Contains(logs, "lacks platform(s) the nodes need: linux/amd64 (node "+d.cluster.RealNodeName()) {
		d.failf("the tick does not say %s lacks linux/amd64, which %s needs", short(e), d.cluster.RealNodeName())
	}
	d.wantImage(checkout, repo+":"+tag+"@"+a)
	d.appPod(checkout)
	d.ok("held: no node of checkout could pull E (platform-missing, exit 1 and an Event); checkout stays on A")
}

// pushArm64Only publishes build of img as an image index that holds only a
// linux/arm64 image: a multi-arch build that lost its amd64 half (V3).
func (d *demo) pushArm64Only(img, build string) string {
	arm64 := v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}
	app, err := content.RandomOCIImageFor(arm64)
	d.must(err, "build the arm64 image")
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: app, Descriptor: v1.Descriptor{Platform: &arm64}})
	ref, err := name.NewTag(d.repo(img)+":"+tag, name.Insecure)
	d.must(err, "name the application image")
	d.must(remote.WriteIndex(ref, idx, remote.WithContext(d.ctx)), "push build "+build)
	digest, err := idx.Digest()
	d.must(err, "digest of build "+build)
	d.ok("pushed %s:%s  build %s (an index of linux/arm64 only)  %s → %s", d.nodeRepo(img), tag, build, short(d.digests[img]), short(digest.String()))
	d.digests[img] = digest.String()
	return digest.String()
}

func (d *demo) sign(key testsign.Signer, repo, digest string) {
	ref, err := name.NewDigest(repo+"@"+digest, name.Insecure)
	d.must(err, "name "+digest)
	tagRef, img, err := key.LegacySignature(ref, nil, testsign.LegacyPayload(ref))
	d.must(err, "sign "+digest)
	d.must(remote.Write(tagRef, img, remote.WithContext(d.ctx)), "push the signature of "+digest)
	d.ok("signed %s with release.key (a cosign signature at %s)", short(digest), tagRef.TagStr()[:19]+"….sig")
}

// noCriticals is step 8's condition on the scan (V5).
const noCriticals = "predicate.scanner.result.summary.critical == 0"

// scan attests a vulnerability scan of digest with critical findings, as
// cosign attest --type vuln --new-bundle-format=false pushes it.
func (d *demo) scan(key testsign.Signer, repo, digest string, critical int) {
	ref, err := name.NewDigest(repo+"@"+digest, name.Insecure)
	d.must(err, "name "+digest)
	st := testsign.AttestationStatement(ref, testsign.VulnPredicate, map[string]any{"scanner": map[string]any{
		"uri": "pkg:github/aquasecurity/trivy", "result": map[string]any{"summary": map[string]any{"critical": critical}}}})
	tagRef, img, err := key.LegacyAttestation(ref, st)
	d.must(err, "attest the scan of "+digest)
	d.must(remote.Write(tagRef, img, remote.WithContext(d.ctx)), "push the scan attestation of "+digest)
	d.ok("attested a scan of %s with %d critical(s) (a signed in-toto statement at %s)", short(digest), critical, tagRef.TagStr()[:19]+"….att")
}

// pushCrashing publishes a build whose container exits 1 at once.
func (d *demo) pushCrashing(img, build string) string {
	app, err := localcluster.CrashingAppImage(d.o.binDir, build, 1)
	return d.pushApp(img, build, " (exits 1)", app, err)
}

// tickWith runs one tick of config cfg and fails unless it exits want.
func (d *demo) tickWith(cfg string, want int) string {
	code, _, logs := d.imageRefresh("tick", "--config", cfg, "--discovery=false")
	if code != want {
		d.failf("tick exited %d, want %d", code, want)
	}
	return logs
}

func (d *demo) wantImage(t target, want string) {
	dep, err := d.kube.AppsV1().Deployments(namespace).Get(d.ctx, t.name, metav1.GetOptions{})
	d.must(err, "read Deployment "+t.name)
	if got := dep.Spec.Template.Spec.Containers[0].Image; got != want {
		d.failf("%s asks for %s, want %s", t.name, got, want)
	}
}
