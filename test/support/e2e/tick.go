package e2e

import (
	"context"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PinAll runs the two ticks that bring the seed's shape onto the digest.
func (e *Env) PinAll(cfg string) {
	e.T.Helper()
	e.Tick(cfg)
	if code, _ := e.Tick(cfg); code != 0 {
		e.T.Fatalf("setup: pinning tick exit %d", code)
	}
}

// LimitedKubeconfig returns a kubeconfig of a user who may get and patch
// only the named Deployments (and write Events) in the env's namespace, and
// list the nodes (V3), and a func that changes the names (the operator
// fixing the RBAC).
func (e *Env) LimitedKubeconfig(deployments ...string) (string, func(deployments ...string)) {
	e.T.Helper()
	kubeconfig, err := e.C.UserKubeconfig("limited-" + e.NS)
	if err != nil {
		e.T.Fatal(err)
	}
	ctx := context.Background()
	rules := func(names []string) []rbacv1.PolicyRule {
		return []rbacv1.PolicyRule{
			{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, ResourceNames: names, Verbs: []string{"get", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "list", "patch"}},
			// The copies of the groups' state beside their anchors (R25).
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update"}},
		}
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "limited", Namespace: e.NS}, Rules: rules(deployments)}
	if _, err := e.C.Client.RbacV1().Roles(e.NS).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		e.T.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "limited", Namespace: e.NS},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "limited"},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: "limited-" + e.NS}}}
	if _, err := e.C.Client.RbacV1().RoleBindings(e.NS).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		e.T.Fatal(err)
	}
	// The nodes' labels, cluster-wide, for the platforms a new digest
	// must serve (V3): list only, as the chart grants a tick.
	nodes := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "limited-nodes-" + e.NS},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list"}}}}
	if _, err := e.C.Client.RbacV1().ClusterRoles().Create(ctx, nodes, metav1.CreateOptions{}); err != nil {
		e.T.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: nodes.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: nodes.Name},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: "limited-" + e.NS}}}
	if _, err := e.C.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() {
		_ = e.C.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), crb.Name, metav1.DeleteOptions{})
		_ = e.C.Client.RbacV1().ClusterRoles().Delete(context.Background(), nodes.Name, metav1.DeleteOptions{})
	})
	return kubeconfig, func(deployments ...string) {
		role.Rules = rules(deployments)
		if _, err := e.C.Client.RbacV1().Roles(e.NS).Update(ctx, role, metav1.UpdateOptions{}); err != nil {
			e.T.Fatal(err)
		}
	}
}
