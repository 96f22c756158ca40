package registry

import (
	"context"
	"net/http"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/image-refresh/image-refresh/test/support/testregistry"
)

// budget is what a client cost the registry: requests by kind and new TCP
// connections.
type budget struct{ pings, tokens, heads, conns int }

func spent(s *testregistry.Server) budget {
	b := budget{conns: s.Conns()}
	for _, r := range s.Requests() {
		switch {
		case r.Method == http.MethodGet && r.Path == "/v2/":
			b.pings++
		case r.Path == testregistry.TokenPath:
			b.tokens++
		case r.Method == http.MethodHead:
			b.heads++
		}
	}
	return b
}

func (b budget) minus(o budget) budget {
	return budget{b.pings - o.pings, b.tokens - o.tokens, b.heads - o.heads, b.conns - o.conns}
}

// freshKeychain is what a tick hands Latest: a new keychain object each time
// (the reconciler rebuilds it from the pull secrets), with the same
// credential.
func freshKeychain(host, user, pass string) authn.Keychain {
	if user == "" {
		return nil
	}
	return Keychain(staticKeychain{host: host, user: user, pass: pass})
}

func TestLatest_C2_RepeatedResolvesCostOneHeadAndNoPingTokenOrConnection(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     func() []testregistry.Option
		user     string
		insecure bool // configured as an insecure host, as well as being loopback
	}{
		{name: "anonymous", opts: func() []testregistry.Option { return nil }},
		{name: "anonymous on an insecure host", opts: func() []testregistry.Option { return nil }, insecure: true},
		{name: "basic auth", opts: func() []testregistry.Option {
			return []testregistry.Option{testregistry.WithBasicAuth("robot", "s3cret")}
		}, user: "robot"},
		{name: "bearer token auth", opts: func() []testregistry.Option {
			return []testregistry.Option{testregistry.WithTokenAuth("robot", "s3cret")}
		}, user: "robot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := testregistry.Start(t, tc.opts()...)
			want := s.MustPushRandomImage(t, "acme/api", "prod")
			var hosts []HostConfig
			if tc.insecure {
				hosts = []HostConfig{{Host: s.Host(), Insecure: true}}
			}
			r := newResolver(t, Options{Hosts: hosts})
			repo := s.Host() + "/acme/api"
			resolve := func() {
				t.Helper()
				got, err := r.Latest(context.Background(), repo, "prod", freshKeychain(s.Host(), tc.user, "s3cret"))
				if err != nil || got != want {
					t.Fatalf("Latest = %q, %v; want %s", got, err, want)
				}
			}
			resolve()
			first := spent(s)
			if first.pings != 1 || first.heads != 1 {
				t.Fatalf("first resolve cost %+v, want 1 ping and 1 HEAD", first)
			}
			if tc.name == "bearer token auth" && first.tokens != 1 {
				t.Fatalf("first resolve cost %+v, want 1 token", first)
			}
			const polls = 5
			for range polls {
				resolve()
			}
			if got, want := spent(s).minus(first), (budget{heads: polls}); got != want {
				t.Fatalf("%d more resolves cost %+v, want %+v: one HEAD each, no ping, no token, no new connection", polls, got, want)
			}
		})
	}
}

func TestLatest_C2_ExpiredTokenIsRefreshedOnceOnTheChallenge(t *testing.T) {
	s := testregistry.Start(t, testregistry.WithTokenAuth("robot", "s3cret"))
	want := s.MustPushRandomImage(t, "acme/api", "prod")
	r := newResolver(t, Options{})
	repo := s.Host() + "/acme/api"
	resolve := func() {
		t.Helper()
		got, err := r.Latest(context.Background(), repo, "prod", freshKeychain(s.Host(), "robot", "s3cret"))
		if err != nil || got != want {
			t.Fatalf("Latest = %q, %v; want %s", got, err, want)
		}
	}
	resolve()
	resolve()
	before := spent(s)
	s.RevokeTokens() // the token expires
	resolve()
	if got, want := spent(s).minus(before), (budget{tokens: 1, heads: 2}); got != want {
		t.Fatalf("the resolve after expiry cost %+v, want %+v: the HEAD is challenged, one token, the HEAD again, no ping", got, want)
	}
	before = spent(s)
	resolve()
	if got, want := spent(s).minus(before), (budget{heads: 1}); got != want {
		t.Fatalf("the next resolve cost %+v, want %+v: the new token is reused", got, want)
	}
}

func TestLatest_R20_RotatedCredentialGetsANewSessionAndTheOldIsNotUsed(t *testing.T) {
	s := testregistry.Start(t, testregistry.WithTokenAuth("robot", "new-pass"))
	want := s.MustPushRandomImage(t, "acme/api", "prod")
	r := newResolver(t, Options{})
	repo := s.Host() + "/acme/api"
	if _, err := r.Latest(context.Background(), repo, "prod", freshKeychain(s.Host(), "robot", "old-pass")); err == nil {
		t.Fatal("Latest with the old password succeeded")
	}
	got, err := r.Latest(context.Background(), repo, "prod", freshKeychain(s.Host(), "robot", "new-pass"))
	if err != nil || got != want {
		t.Fatalf("Latest with the rotated password = %q, %v; want %s", got, err, want)
	}
	// The working session is not lent to another credential, nor to none:
	// a removed pull secret is not masked by a cached token.
	if _, err := r.Latest(context.Background(), repo, "prod", freshKeychain(s.Host(), "robot", "old-pass")); err == nil {
		t.Fatal("Latest with the old password succeeded through the new password's session")
	}
	if _, err := r.Latest(context.Background(), repo, "prod", nil); err == nil {
		t.Fatal("Latest without credentials succeeded through a cached session")
	}
}

func TestVerifyAndHas_C2_ShareTheSessionOfLatest(t *testing.T) {
	s := testregistry.Start(t, testregistry.WithTokenAuth("robot", "s3cret"))
	d := s.MustPushRandomImage(t, "acme/api", "prod")
	r := newResolver(t, Options{})
	repo := s.Host() + "/acme/api"
	kc := freshKeychain(s.Host(), "robot", "s3cret")
	if _, err := r.Latest(context.Background(), repo, "prod", kc); err != nil {
		t.Fatal(err)
	}
	first := spent(s)
	if err := r.Verify(context.Background(), repo, "prod", d, kc); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.Has(context.Background(), repo, d, kc); !ok || err != nil {
		t.Fatalf("Has = %v, %v", ok, err)
	}
	if got := spent(s).minus(first); got.pings != 0 || got.tokens != 0 || got.conns != 0 {
		t.Fatalf("Verify and Has after Latest cost %+v, want no ping, token or new connection", got)
	}
}
