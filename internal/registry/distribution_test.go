package registry

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/image-refresh/image-refresh/test/support/distribution"
)

// frontedDistribution starts Distribution with opts behind a front that
// counts what reaches it, pushes acme/api:prod, and returns them with
// resolve: one Latest of acme/api:prod through the front with fresh
// credentials, failing t unless it answers the pushed digest.
func frontedDistribution(t *testing.T, opts distribution.Options) (*distribution.Registry, *distribution.Front, func()) {
	t.Helper()
	reg := distribution.StartWithT(t, opts)
	want := reg.MustPushRandomImage(t, "acme/api", "prod")
	front, err := reg.StartFront()
	if err != nil {
		t.Fatal(err)
	}
	r := newResolver(t, Options{Hosts: []HostConfig{{Host: front.Host, CAFile: reg.CAFile}}})
	repo := front.Host + "/acme/api"
	return reg, front, func() {
		t.Helper()
		got, err := r.Latest(context.Background(), repo, "prod", freshKeychain(front.Host, reg.User, reg.Password))
		if err != nil || got != want {
			t.Fatalf("Latest = %q, %v; want %s", got, err, want)
		}
	}
}

// frontBudget is what a client cost the real Distribution registry, counted
// at a TLS front of it (requests and connections) and at its token server.
func frontBudget(r *distribution.Registry, f *distribution.Front) budget {
	b := budget{conns: f.Conns()}
	if r.Token != nil {
		b.tokens = r.Token.Requests()
		b.conns += r.Token.Conns()
	}
	for _, req := range f.Requests() {
		switch {
		case req.Method == http.MethodGet && req.Path == "/v2/":
			b.pings++
		case req.Method == http.MethodHead:
			b.heads++
		}
	}
	return b
}

func TestLatest_C2_DistributionRepeatedResolvesCostOneHeadEach(t *testing.T) {
	for _, tc := range []struct {
		name  string
		token bool
	}{
		{name: "htpasswd basic auth"},
		{name: "token auth", token: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg, front, resolve := frontedDistribution(t, distribution.Options{TokenAuth: tc.token})
			pushed := frontBudget(reg, front) // the push took a token
			resolve()
			first := frontBudget(reg, front)
			wantFirst := budget{pings: 1, heads: 1, conns: 1}
			if tc.token {
				wantFirst = budget{pings: 1, tokens: 1, heads: 1, conns: 2}
			}
			if first.minus(pushed) != wantFirst {
				t.Fatalf("first resolve cost %+v, want %+v", first, wantFirst)
			}
			const polls = 5
			for range polls {
				resolve()
			}
			if got, want := frontBudget(reg, front).minus(first), (budget{heads: polls}); got != want {
				t.Fatalf("%d more resolves cost %+v, want %+v: one HEAD each, no ping, no token, no new connection", polls, got, want)
			}
			if strings.Contains(reg.Log(), reg.Password) {
				t.Error("the registry log holds the password")
			}
		})
	}
}

func TestLatest_C2_DistributionExpiredTokenIsRefreshedOnce(t *testing.T) {
	reg, front, resolve := frontedDistribution(t, distribution.Options{TokenAuth: true})
	// The first token is issued already expired: Distribution refuses it,
	// the client takes one new token and repeats the HEAD once.
	reg.Token.ExpireNext(1)
	pushed := frontBudget(reg, front)
	resolve()
	if got, want := frontBudget(reg, front).minus(pushed), (budget{pings: 1, tokens: 2, heads: 2, conns: 2}); got != want {
		t.Fatalf("first resolve with an expired token cost %+v, want %+v", got, want)
	}
	before := frontBudget(reg, front)
	resolve()
	if got, want := frontBudget(reg, front).minus(before), (budget{heads: 1}); got != want {
		t.Fatalf("the next resolve cost %+v, want %+v: the refreshed token is reused", got, want)
	}
}
