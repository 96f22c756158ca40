package verify

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/image-refresh/image-refresh/internal/config"
	"github.com/image-refresh/image-refresh/test/support/cosigncli"
)

// The real cosign CLI (v3, built from its released module by
// hack/build-cosign.sh) signs and attests digests in the in-process
// registry on loopback; image-refresh decides, and where it accepts,
// cosign verify and cosign verify-attestation agree. Every cosign command
// is offline, as docs/states/unverified.md gives them: keyed signing with
// no transparency log upload and no signing config from TUF, verification
// with --insecure-ignore-tlog.

// The flags of docs/states/unverified.md.
var (
	cosignRegistryFlags = []string{"--allow-http-registry", "--allow-insecure-registry"}
	cosignSignFlags     = append([]string{"--tlog-upload=false", "--use-signing-config=false"}, cosignRegistryFlags...)
	cosignVerifyFlags   = append([]string{"--insecure-ignore-tlog"}, cosignRegistryFlags...)
)

// cosignFixture is the registry, cosign with two key pairs of its own
// (release: the policy's; stranger: another), and the policy as loaded
// from a config file by config.Load with CheckTrust.
type cosignFixture struct {
	*fixture
	cli                  *cosigncli.CLI
	release, stranger    string // private keys
	releasePub, otherPub string
	releaseHint, strHint string
	slsaFile, cleanScan  string
	criticalScan, review string
}

func newCosignFixture(t *testing.T) *cosignFixture {
	f := &cosignFixture{fixture: newFixture(t, true), cli: cosigncli.New(t)}
	f.release, f.releasePub = f.cli.GenerateKeyPair(t, "release")
	f.stranger, f.otherPub = f.cli.GenerateKeyPair(t, "stranger")
	f.releaseHint, f.strHint = keyHintOf(t, f.releasePub), keyHintOf(t, f.otherPub)
	write := func(name, data string) string {
		p := filepath.Join(f.cli.Dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	f.slsaFile = write("provenance.json", `{
  "buildDefinition": {
    "buildType": "https://actions.github.io/buildtypes/workflow/v1",
    "externalParameters": {"workflow": {"repository": "https://github.com/acme/api", "ref": "refs/heads/main", "path": ".github/workflows/release.yml"}}
  },
  "runDetails": {"builder": {"id": "https://github.com/actions/runner"}, "metadata": {"invocationID": "42"}}
}`)
	f.cleanScan = write("scan-clean.json", `{"scanner": {"uri": "pkg:github/aquasecurity/trivy", "version": "0.58.0", "result": {"summary": {"critical": 0, "high": 3}}}}`)
	f.criticalScan = write("scan-critical.json", `{"scanner": {"uri": "pkg:github/aquasecurity/trivy", "version": "0.58.0", "result": {"summary": {"critical": 2, "high": 3}}}}`)
	f.review = write("review.json", `{"approved": true, "reviewers": ["alice", "bob"]}`)
	return f
}

// keyHintOf is a PEM public key file's hint as cosign writes it in a
// bundle (base64 of the SHA-256 of its DER).
func keyHintOf(t *testing.T, pubFile string) string {
	t.Helper()
	data, err := os.ReadFile(pubFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s holds no PEM block", pubFile)
	}
	sum := sha256.Sum256(block.Bytes)
	return base64.StdEncoding.EncodeToString(sum[:])
}

// policy loads a config with one policy trusting release.pub and
// requiring attestations (YAML lines under "attestations:"; "" none).
func (f *cosignFixture) policy(t *testing.T, attestations string) *config.VerificationPolicy {
	t.Helper()
	body := "verification:\n  - name: release\n    repositories: [\"127.0.0.1:*/**\"]\n    cosign: {publicKeys: [" + f.releasePub + "]}\n"
	if attestations != "" {
		body += "    attestations:\n" + attestations
	}
	body += `groups:
  - name: web
    anchor: {kind: Deployment, namespace: shop, name: api}
    images:
      - name: api
        repository: registry.example.com/acme/api
        tag: prod
        targets:
          - {kind: Deployment, namespace: shop, name: api, container: api}
`
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(path, CheckTrust)
	if err != nil {
		t.Fatal(err)
	}
	return &c.Verification[0]
}

func (f *cosignFixture) verifyDigest(t *testing.T, d name.Digest, p *config.VerificationPolicy) (Verdict, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return Verify(ctx, d, p, f.opts...)
}

func (f *cosignFixture) sign(t *testing.T, key string, d name.Digest, extra ...string) {
	t.Helper()
	f.cli.MustRun(t, append(append(append([]string{"sign", "--key", key}, cosignSignFlags...), extra...), d.String())...)
}

func (f *cosignFixture) attest(t *testing.T, key, typ, predicate string, d name.Digest, extra ...string) {
	t.Helper()
	f.cli.MustRun(t, append(append(append([]string{"attest", "--key", key, "--type", typ, "--predicate", predicate}, cosignSignFlags...), extra...), d.String())...)
}

// cosignVerifies runs cosign verify (typ "") or cosign verify-attestation
// --type typ with release.pub and says whether it accepted the digest.
func (f *cosignFixture) cosignVerifies(t *testing.T, d name.Digest, typ string) (bool, string) {
	t.Helper()
	args := []string{"verify", "--key", f.releasePub}
	if typ != "" {
		args = []string{"verify-attestation", "--key", f.releasePub, "--type", typ}
	}
	out, err := f.cli.Run(append(append(args, cosignVerifyFlags...), d.String())...)
	return err == nil, out
}

// agree checks that image-refresh's verdict is want, and that cosign
// accepts the digest (each attestation type of types too) wherever
// image-refresh does, and rejects it where told (cosignRejects).
func (f *cosignFixture) agree(t *testing.T, d name.Digest, v Verdict, err error, want bool, cosignRejects bool, types ...string) {
	t.Helper()
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if v.Verified != want {
		t.Fatalf("image-refresh: want verified=%v, got %s", want, v)
	}
	for _, typ := range append([]string{""}, types...) {
		ok, out := f.cosignVerifies(t, d, typ)
		switch {
		case want && !ok:
			t.Errorf("image-refresh accepted %s, cosign verify%s rejects it:\n%s", d, typeArg(typ), out)
		case cosignRejects && ok:
			t.Errorf("cosign verify%s accepts %s, which image-refresh holds (%s):\n%s", typeArg(typ), d, v, out)
		case cosignRejects && !cosignSaysUnverified(out):
			t.Errorf("cosign verify%s failed for another reason than a verdict:\n%s", typeArg(typ), out)
		}
	}
}

// cosignSaysUnverified tells a rejection by cosign (its verdict) from a
// failure to run (a flag, the registry, the network): a negative check
// counts only as a verdict.
func cosignSaysUnverified(out string) bool {
	for _, verdict := range []string{"no signatures found", "no matching signatures", "no matching attestations", "failed to verify", "none of the attestations matched"} {
		if strings.Contains(out, verdict) {
			return true
		}
	}
	return false
}

func typeArg(typ string) string {
	if typ == "" {
		return ""
	}
	return "-attestation --type " + typ
}

const (
	cosignSLSACondition = "      - predicateType: https://slsa.dev/provenance/v1\n        conditions: ['" + fromOurRepoCondition + "']\n"
	cosignVulnCondition = "      - predicateType: https://cosign.sigstore.dev/attestation/vuln/v1\n        conditions: ['" + noCriticalCondition + "']\n"
)

func TestCosignCLI_V1_KeyedSignaturesMadeByCosignAreJudgedAsCosignJudgesThem(t *testing.T) {
	f := newCosignFixture(t)
	p := f.policy(t, "")

	t.Run("a bundle signed with the policy's key is verified, as cosign verify does", func(t *testing.T) {
		d := f.pushImage("bundle")
		f.sign(t, f.release, d)
		v, err := f.verifyDigest(t, d, p)
		f.agree(t, d, v, err, true, false)
		if v.By.Format != FormatBundle {
			t.Errorf("want a bundle, got %s", v)
		}
	})
	t.Run("a legacy .sig signed with the policy's key is verified, as cosign verify does", func(t *testing.T) {
		d := f.pushImage("legacy")
		f.sign(t, f.release, d, "--new-bundle-format=false")
		v, err := f.verifyDigest(t, d, p)
		f.agree(t, d, v, err, true, false)
		if v.By.Format != FormatLegacy {
			t.Errorf("want a legacy signature, got %s", v)
		}
	})
	t.Run("an unsigned digest is held, and cosign verify rejects it", func(t *testing.T) {
		d := f.pushImage("unsigned")
		v, err := f.verifyDigest(t, d, p)
		f.agree(t, d, v, err, false, true)
	})
	t.Run("a bundle by another key is held naming the key that signed and the key tried; cosign verify rejects it", func(t *testing.T) {
		d := f.pushImage("stranger")
		f.sign(t, f.stranger, d)
		v, err := f.verifyDigest(t, d, p)
		f.agree(t, d, v, err, false, true)
		wantRejected(t, v, err, FormatBundle, WrongKey, "signed by the key with hint "+f.strHint+"; tried "+f.releasePub+" (key hint "+f.releaseHint+")")
	})
	t.Run("a bundle by another key beside a legacy .sig by the policy's key is held; cosign verify rejects it too", func(t *testing.T) {
		d := f.pushImage("mixed")
		f.sign(t, f.release, d, "--new-bundle-format=false")
		f.sign(t, f.stranger, d)
		v, err := f.verifyDigest(t, d, p)
		f.agree(t, d, v, err, false, true)
		wantRejected(t, v, err, FormatLegacy, BesideBundle, "only bundles count")
	})
}

func TestCosignCLI_V5_AttestationsMadeByCosignAreRequiredAndJudged(t *testing.T) {
	f := newCosignFixture(t)
	p := f.policy(t, cosignSLSACondition+cosignVulnCondition)

	t.Run("bundles: signed, provenance from our repository, a clean scan: verified; cosign verify-attestation agrees", func(t *testing.T) {
		d := f.pushImage("attested")
		f.sign(t, f.release, d)
		f.attest(t, f.release, "slsaprovenance1", f.slsaFile, d)
		f.attest(t, f.release, "vuln", f.cleanScan, d)
		v, err := f.verifyDigest(t, d, p)
		f.agree(t, d, v, err, true, false, "slsaprovenance1", "vuln")
		wantAttestation(t, v, err, slsa, FormatBundle, "", "")
		wantAttestation(t, v, err, vuln, FormatBundle, "", "")
	})
	t.Run("legacy: a .sig and .att attestations: verified; cosign verify-attestation agrees", func(t *testing.T) {
		d := f.pushImage("attested-legacy")
		f.sign(t, f.release, d, "--new-bundle-format=false")
		f.attest(t, f.release, "slsaprovenance1", f.slsaFile, d, "--new-bundle-format=false")
		f.attest(t, f.release, "vuln", f.cleanScan, d, "--new-bundle-format=false")
		v, err := f.verifyDigest(t, d, p)
		f.agree(t, d, v, err, true, false, "slsaprovenance1", "vuln")
		wantAttestation(t, v, err, slsa, FormatLegacyAttestation, "", "")
		wantAttestation(t, v, err, vuln, FormatLegacyAttestation, "", "")
	})
	t.Run("a scan with criticals is held naming the condition (cosign has no such condition and accepts the signed scan)", func(t *testing.T) {
		d := f.pushImage("critical")
		f.sign(t, f.release, d)
		f.attest(t, f.release, "slsaprovenance1", f.slsaFile, d)
		f.attest(t, f.release, "vuln", f.criticalScan, d)
		v, err := f.verifyDigest(t, d, p)
		wantAttestation(t, v, err, vuln, FormatBundle, ConditionFailed, `condition "`+noCriticalCondition+`" is false`)
		if ok, out := f.cosignVerifies(t, d, "vuln"); !ok {
			t.Errorf("cosign verify-attestation rejects the signed scan:\n%s", out)
		}
	})
	t.Run("a digest without the scan is held naming it as missing; cosign verify-attestation --type vuln rejects it", func(t *testing.T) {
		d := f.pushImage("no-scan")
		f.sign(t, f.release, d)
		f.attest(t, f.release, "slsaprovenance1", f.slsaFile, d)
		v, err := f.verifyDigest(t, d, p)
		wantAttestation(t, v, err, vuln, "", isMissing, "")
		if ok, out := f.cosignVerifies(t, d, "vuln"); ok || !cosignSaysUnverified(out) {
			t.Errorf("cosign verify-attestation does not reject a digest without a scan:\n%s", out)
		}
	})
	t.Run("a scan attested with another key is held naming both keys; cosign verify-attestation rejects it", func(t *testing.T) {
		d := f.pushImage("stranger-scan")
		f.sign(t, f.release, d)
		f.attest(t, f.release, "slsaprovenance1", f.slsaFile, d)
		f.attest(t, f.stranger, "vuln", f.cleanScan, d)
		v, err := f.verifyDigest(t, d, p)
		wantAttestation(t, v, err, vuln, FormatBundle, WrongKey, "signed by the key with hint "+f.strHint)
		if ok, out := f.cosignVerifies(t, d, "vuln"); ok || !cosignSaysUnverified(out) {
			t.Errorf("cosign verify-attestation does not reject a scan by another key:\n%s", out)
		}
	})
	t.Run("a custom predicate type with its own condition is verified; cosign verify-attestation agrees", func(t *testing.T) {
		const review = "https://example.com/acme/review/v1"
		d := f.pushImage("reviewed")
		f.sign(t, f.release, d)
		f.attest(t, f.release, review, f.review, d)
		p := f.policy(t, "      - predicateType: "+review+"\n        conditions: ['predicate.approved == true', 'size(predicate.reviewers) >= 2']\n")
		v, err := f.verifyDigest(t, d, p)
		f.agree(t, d, v, err, true, false, review)
		wantAttestation(t, v, err, review, FormatBundle, "", "")
	})
}

// The offline commands docs/states/unverified.md gives (sign, attest,
// verify, verify-attestation), run as written against the test's registry
// (plus the plain-HTTP flag the page names): each succeeds, and the
// digest they sign and attest verifies under a policy requiring the scan.
func TestUnverifiedDoc_V5_TheOfflineCosignCommandsWork(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "states", "unverified.md"))
	if err != nil {
		t.Fatal(err)
	}
	const marker = "<!-- offline-cosign-commands:"
	_, block, ok := strings.Cut(string(doc), marker)
	if !ok {
		t.Fatalf("docs/states/unverified.md has no %q block", marker)
	}
	_, block, _ = strings.Cut(block, "```sh\n")
	block, _, _ = strings.Cut(block, "```")
	var commands [][]string
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		args := strings.Fields(line)
		if len(args) < 2 || args[0] != "cosign" {
			t.Fatalf("not a cosign command in the block: %q", line)
		}
		commands = append(commands, args[1:])
	}
	want := []string{"sign", "attest", "verify", "verify-attestation"}
	if len(commands) != len(want) {
		t.Fatalf("want the commands %v, got %v", want, commands)
	}

	f := newCosignFixture(t)
	d := f.pushImage("documented")
	p := f.policy(t, cosignVulnCondition)
	// Before the commands: held, the scan missing (the signature too).
	if v, err := f.verifyDigest(t, d, p); err != nil || v.Verified {
		t.Fatalf("before the commands: want unverified, got %s, %v", v, err)
	}
	for i, args := range commands {
		if args[0] != want[i] {
			t.Fatalf("command %d is cosign %s, want cosign %s", i, args[0], want[i])
		}
		var run []string
		for _, a := range args {
			switch a {
			case "REPO@DIGEST":
				run = append(run, cosignRegistryFlags[0], d.String())
			case "cosign.key":
				a = f.release
			case "cosign.pub":
				a = f.releasePub
			case "scan.json":
				a = f.cleanScan
			}
			if a != "REPO@DIGEST" {
				run = append(run, a)
			}
		}
		f.cli.MustRun(t, run...)
	}
	v, err := f.verifyDigest(t, d, p)
	wantVerified(t, v, err, FormatBundle, f.releasePub)
	wantAttestation(t, v, err, vuln, FormatBundle, "", "")
}
