package e2e

import (
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// StartAPIProxy starts a TLS reverse proxy on loopback in front of the
// cluster's kube-apiserver, which forwards with the admin client
// certificate; serve answers every request, forwarding it through rp when
// it chooses. closing is closed before the server at cleanup, so that a
// held request is released and Close does not wait on it. It returns the
// server and a kubeconfig (file name) that points at it.
func (e *Env) StartAPIProxy(name string, closing chan struct{}, serve func(w http.ResponseWriter, r *http.Request, rp *httputil.ReverseProxy)) (*httptest.Server, string) {
	e.T.Helper()
	upstream, err := url.Parse(e.C.Config.Host)
	if err != nil {
		e.T.Fatal(err)
	}
	tlsCfg, err := rest.TLSConfigFor(e.C.Config) // the admin client cert and the cluster CA
	if err != nil {
		e.T.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(upstream)
	rp.Transport = &http.Transport{TLSClientConfig: tlsCfg, ForceAttemptHTTP2: true}
	rp.FlushInterval = -1                    // watches stream
	rp.ErrorLog = log.New(io.Discard, "", 0) // "connection refused" while the API server restarts is expected
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		serve(w, r, rp)
	}))
	srv.StartTLS()
	e.T.Cleanup(func() {
		close(closing)
		srv.Close()
	})

	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["proxy"] = &clientcmdapi.Cluster{Server: srv.URL, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy"}
	cfg.CurrentContext = "proxy"
	kubeconfig := filepath.Join(e.T.TempDir(), name)
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		e.T.Fatal(err)
	}
	return srv, kubeconfig
}
