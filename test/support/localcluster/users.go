package localcluster

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// UserKubeconfig writes a kubeconfig for a user authenticated by a client
// certificate the cluster CA signs, with no rights until RBAC grants some.
// Tests use it to prove behaviour under an RBAC denial.
func (c *Cluster) UserKubeconfig(user string, groups ...string) (string, error) {
	dir := filepath.Join(c.RunDir, "pki")
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		return "", fmt.Errorf("load cluster CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return "", err
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return "", fmt.Errorf("cluster CA key is %T, want ECDSA", pair.PrivateKey)
	}
	ca := keyPair{cert: caCert, key: key}
	kp, err := ca.sign(dir, "user-"+user, pkix.Name{CommonName: user, Organization: groups}, x509.ExtKeyUsageClientAuth, nil, nil)
	if err != nil {
		return "", err
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return "", err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: c.Server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: kp.certFile, ClientKey: kp.keyFile}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: user}
	cfg.CurrentContext = "local"
	path := filepath.Join(c.RunDir, "kubeconfig-"+user)
	return path, clientcmd.WriteToFile(*cfg, path)
}
