package registry

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// credHelper installs docker-credential-irtest, a real executable on PATH
// that implements the docker credential helper protocol's "get" (the server
// on stdin, {"Username","Secret"} on stdout; "credentials not found" and
// exit 1 for another server), and appends each call to a log so a test can
// count them. It never prints the secret anywhere but stdout.
func credHelper(t *testing.T, server, user, secret string) (calls func() int) {
	t.Helper()
	bin := t.TempDir()
	log := filepath.Join(t.TempDir(), "calls")
	script := `#!/bin/sh
set -eu
[ "$1" = get ] || { echo "unsupported: $1" >&2; exit 1; }
server=$(cat)
echo "$server" >> '` + log + `'
if [ "$server" = '` + server + `' ]; then
  printf '{"ServerURL":"%s","Username":"%s","Secret":"%s"}\n' "$server" '` + user + `' '` + secret + `'
else
  echo "credentials not found in native keychain"
  exit 1
fi
`
	if err := os.WriteFile(filepath.Join(bin, "docker-credential-irtest"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	return func() int {
		b, err := os.ReadFile(log)
		if err != nil {
			return 0
		}
		return strings.Count(string(b), "\n")
	}
}

func dockerConfig(t *testing.T, config string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dir)
}

func TestKeychain_R20_CredentialHelpersFromDockerConfig(t *testing.T) {
	for _, tc := range []struct {
		name   string
		config func(host string) string
		auth   func(user, pass string) testregistry.Option
	}{
		{"credHelpers, basic auth", func(h string) string { return `{"credHelpers":{"` + h + `":"irtest"}}` }, testregistry.WithBasicAuth},
		{"credHelpers, bearer tokens", func(h string) string { return `{"credHelpers":{"` + h + `":"irtest"}}` }, testregistry.WithTokenAuth},
		{"credsStore, basic auth", func(string) string { return `{"credsStore":"irtest"}` }, testregistry.WithBasicAuth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const secret = "h3lper-s3cret-7d1e"
			s := testregistry.Start(t, tc.auth("robot", secret))
			want := s.MustPushRandomImage(t, "acme/api", "prod")
			calls := credHelper(t, s.Host(), "robot", secret)
			dockerConfig(t, tc.config(s.Host()))
			r := newResolver(t, Options{})
			repo := s.Host() + "/acme/api"
			for i := 1; i <= 3; i++ {
				got, err := r.Latest(context.Background(), repo, "prod", Keychain())
				if err != nil || got != want {
					t.Fatalf("Latest = %q, %v; want %s", got, err, want)
				}
			}
			if n := calls(); n == 0 {
				t.Fatal("the credential helper was never run")
			}
			if b := spent(s); b.pings != 1 {
				t.Errorf("three resolves cost %+v, want one ping: the helper's credential is reused", b)
			}
		})
	}
}

func TestKeychain_R20_HelperWithWrongSecretFailsWithoutLeakingIt(t *testing.T) {
	s := testregistry.Start(t, testregistry.WithTokenAuth("robot", "right-one"))
	s.MustPushRandomImage(t, "acme/api", "prod")
	const wrong = "wr0ng-h3lper-s3cret"
	credHelper(t, s.Host(), "robot", wrong)
	dockerConfig(t, `{"credHelpers":{"`+s.Host()+`":"irtest"}}`)
	_, err := newResolver(t, Options{}).Latest(context.Background(), s.Host()+"/acme/api", "prod", Keychain())
	e := wantKind(t, err, KindUnauthorized)
	if strings.Contains(e.Error(), wrong) {
		t.Fatalf("the error holds the helper's secret: %v", e)
	}
}

// A helper configured for another registry is not asked for this one, and
// the resolve goes on anonymously.
func TestKeychain_CredHelperOfAnotherRegistryIsNotUsed(t *testing.T) {
	s := testregistry.Start(t)
	want := s.MustPushRandomImage(t, "acme/api", "prod")
	calls := credHelper(t, "other.example", "robot", "x")
	dockerConfig(t, `{"credHelpers":{"other.example":"irtest"}}`)
	got, err := newResolver(t, Options{}).Latest(context.Background(), s.Host()+"/acme/api", "prod", Keychain())
	if err != nil || got != want {
		t.Fatalf("Latest = %q, %v; want %s", got, err, want)
	}
	if n := calls(); n != 0 {
		t.Fatalf("the helper of another registry ran %d times", n)
	}
}

// A broken helper that prints a secret and fails: the error names the
// registry and the failure, never the helper's output (R20).
func TestKeychain_R20_FailingHelperOutputIsNotInTheError(t *testing.T) {
	s := testregistry.Start(t, testregistry.WithBasicAuth("robot", "x"))
	bin := t.TempDir()
	const leaked = "l3aked-by-a-br0ken-helper"
	script := "#!/bin/sh\ncat >/dev/null\necho '{\"Secret\":\"" + leaked + "\"}'\nexit 1\n"
	if err := os.WriteFile(filepath.Join(bin, "docker-credential-broken"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	dockerConfig(t, `{"credHelpers":{"`+s.Host()+`":"broken"}}`)
	_, err := newResolver(t, Options{}).Latest(context.Background(), s.Host()+"/acme/api", "prod", Keychain())
	if err == nil {
		t.Fatal("Latest with a failing helper succeeded")
	}
	if strings.Contains(err.Error(), leaked) || !strings.Contains(err.Error(), "find credentials for "+s.Host()) {
		t.Fatalf("err = %v; want one naming the registry without the helper's output", err)
	}
}
