package deploy_test

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli/values"
	"helm.sh/helm/v3/pkg/getter"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/bigfleet-vm/provider/config"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt"
	"github.com/bigfleet-vm/provider/hypervisors/proxmox"
)

const chartDir = "helm"

// rendered is one `helm install --dry-run` of the chart, every object
// decoded strictly into its Kubernetes type.
type rendered struct {
	notes       string
	objects     []runtime.Object
	deployment  *appsv1.Deployment
	service     *corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	pvcs        []*corev1.PersistentVolumeClaim
	pdbs        []*policyv1.PodDisruptionBudget
	accounts    []*corev1.ServiceAccount
	monitors    []*monitoringv1.ServiceMonitor
	rules       []*monitoringv1.PrometheusRule
	kindsSorted []string
}

// strictDecoder decodes the kinds the chart may render; unknown fields,
// duplicate fields and unknown kinds are errors.
var strictDecoder = func() runtime.Decoder {
	sch := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(sch); err != nil {
		panic(err)
	}
	if err := monitoringv1.AddToScheme(sch); err != nil {
		panic(err)
	}
	return serializer.NewCodecFactory(sch, serializer.EnableStrict).UniversalDeserializer()
}()

// renderChart renders the chart the way `helm install NAME deploy/helm -n
// NS -f FILES --set SET --set-file SETFILE` would, without a cluster.
func renderChart(release, namespace string, files, set, setFile []string) (*rendered, error) {
	return renderWith(release, namespace, files, values.Options{Values: set, FileValues: setFile})
}

// renderWith is renderChart with any value options (--set-json too).
// files are under testdata/values unless absolute.
func renderWith(release, namespace string, files []string, opts values.Options) (*rendered, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	for _, f := range files {
		if !filepath.IsAbs(f) {
			f = filepath.Join("testdata", "values", f)
		}
		opts.ValueFiles = append(opts.ValueFiles, f)
	}
	vals, err := opts.MergeValues(getter.Providers{})
	if err != nil {
		return nil, fmt.Errorf("merge values: %w", err)
	}
	in := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	in.DryRun, in.ClientOnly, in.Replace = true, true, true
	in.ReleaseName, in.Namespace = release, namespace
	in.APIVersions = chartutil.VersionSet{"monitoring.coreos.com/v1"}
	// A library build of Helm defaults to Kubernetes v1.20; say which
	// cluster we render for, as `helm template --kube-version` would.
	kv, err := chartutil.ParseKubeVersion("v1.31.0")
	if err != nil {
		return nil, err
	}
	in.KubeVersion = kv
	rel, err := in.Run(ch, vals)
	if err != nil {
		return nil, err
	}
	r := &rendered{notes: rel.Info.Notes, configMaps: map[string]*corev1.ConfigMap{}}
	manifests := releaseutil.SplitManifests(rel.Manifest)
	names := make([]string, 0, len(manifests))
	for k := range manifests {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		doc := manifests[k]
		obj, gvk, err := strictDecoder.Decode([]byte(doc), nil, nil)
		if err != nil {
			return nil, fmt.Errorf("strict decode of\n%s\n: %w", doc, err)
		}
		r.objects = append(r.objects, obj)
		r.kindsSorted = append(r.kindsSorted, gvk.Kind)
		switch o := obj.(type) {
		case *appsv1.Deployment:
			if r.deployment != nil {
				return nil, fmt.Errorf("two Deployments rendered")
			}
			r.deployment = o
		case *corev1.Service:
			r.service = o
		case *corev1.ConfigMap:
			r.configMaps[o.Name] = o
		case *corev1.PersistentVolumeClaim:
			r.pvcs = append(r.pvcs, o)
		case *policyv1.PodDisruptionBudget:
			r.pdbs = append(r.pdbs, o)
		case *corev1.ServiceAccount:
			r.accounts = append(r.accounts, o)
		case *monitoringv1.ServiceMonitor:
			r.monitors = append(r.monitors, o)
		case *monitoringv1.PrometheusRule:
			r.rules = append(r.rules, o)
		default:
			return nil, fmt.Errorf("unexpected kind %s rendered", gvk)
		}
	}
	sort.Strings(r.kindsSorted)
	if r.deployment == nil || r.service == nil {
		return nil, fmt.Errorf("no Deployment or Service rendered (kinds %v)", r.kindsSorted)
	}
	return r, nil
}

// container returns the provider container.
func (r *rendered) container(t *testing.T) corev1.Container {
	t.Helper()
	cs := r.deployment.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != "provider" {
		t.Fatalf("want one container named provider, got %d", len(cs))
	}
	return cs[0]
}

// fixtures are the Secrets and pre-existing ConfigMaps an operator creates
// next to the chart, with the keys the documentation names.
type fixtures struct {
	secrets    map[string]map[string][]byte
	configMaps map[string]map[string]string
	caPEM      string
	token      string
	// podIP is what the downward API gives status.podIP.
	podIP string
}

func newFixtures(t *testing.T) *fixtures {
	t.Helper()
	ca := newCA(t, "bigfleet test CA")
	server := ca.issue(t, "bigfleet-provider", false)
	client := ca.issue(t, "libvirt-client", true)
	sshKey, knownHosts := sshMaterial(t)
	tlsSecret := map[string][]byte{"tls.crt": server.certPEM, "tls.key": server.keyPEM, "ca.crt": ca.certPEM}
	return &fixtures{
		secrets: map[string]map[string][]byte{
			"bigfleet-libvirt-ssh":      {"id_ed25519": sshKey, "known_hosts": knownHosts},
			"bigfleet-libvirt-pki":      {"cacert.pem": ca.certPEM, "clientcert.pem": client.certPEM, "clientkey.pem": client.keyPEM},
			"bigfleet-libvirt-tls-grpc": tlsSecret,
			"bigfleet-proxmox-tls-grpc": tlsSecret,
			"bigfleet-proxmox-token":    {"token": []byte("0b7a5e3c-4c1e-4b8e-9d1a-2f6c0e8d9a71\n")},
			"pve-token":                 {"secret": []byte("0b7a5e3c-4c1e-4b8e-9d1a-2f6c0e8d9a71")},
			// etcd client TLS of an HA release: the members' CA and a
			// client certificate for --client-cert-auth.
			"bigfleet-etcd-tls": {"ca.crt": ca.certPEM, "tls.crt": client.certPEM, "tls.key": client.keyPEM},
		},
		configMaps: map[string]map[string]string{"pve-root-ca": {"pve-root-ca.pem": string(ca.certPEM)}},
		caPEM:      string(ca.certPEM),
		token:      "0b7a5e3c-4c1e-4b8e-9d1a-2f6c0e8d9a71",
		podIP:      "10.244.1.7",
	}
}

// materialised is the pod's filesystem as the test laid it out.
type materialised struct {
	root     string
	args     []string          // the container args, paths moved under root
	writable map[string]string // mount path -> "emptyDir" or "pvc"
}

// pathRE finds absolute paths under the chart's mount roots in an argument.
var pathRE = regexp.MustCompile(`/(etc/bigfleet|var/lib/bigfleet|tmp)(/[^&,=?\s]*)?`)

// materialise lays the pod's volumes out under a temporary root exactly as
// the kubelet would (ConfigMaps from the rendered objects or the fixtures,
// Secrets from the fixtures, items and all), and moves every path the
// container arguments name under that root. A path outside every mount, a
// Secret or ConfigMap nobody provides, or a key missing from one is a
// failure: the pod would not start, or the provider would not find its
// file.
func materialise(t *testing.T, r *rendered, fx *fixtures) materialised {
	t.Helper()
	c := r.container(t)
	root := t.TempDir()
	vols := map[string]corev1.Volume{}
	for _, v := range r.deployment.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	m := materialised{root: root, writable: map[string]string{}}
	var mounts []string
	for _, vm := range c.VolumeMounts {
		v, ok := vols[vm.Name]
		if !ok {
			t.Fatalf("volumeMount %s names no volume", vm.Name)
		}
		dir := filepath.Join(root, vm.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		mounts = append(mounts, vm.MountPath)
		var data map[string][]byte
		var items []corev1.KeyToPath
		switch {
		case v.EmptyDir != nil:
			m.writable[vm.MountPath] = "emptyDir"
			continue
		case v.PersistentVolumeClaim != nil:
			m.writable[vm.MountPath] = "pvc"
			continue
		case v.ConfigMap != nil:
			items = v.ConfigMap.Items
			if cm, ok := r.configMaps[v.ConfigMap.Name]; ok {
				data = map[string][]byte{}
				for k, s := range cm.Data {
					data[k] = []byte(s)
				}
			} else if ext, ok := fx.configMaps[v.ConfigMap.Name]; ok {
				data = map[string][]byte{}
				for k, s := range ext {
					data[k] = []byte(s)
				}
			} else {
				t.Fatalf("volume %s mounts ConfigMap %q, which the chart does not render and no operator-created fixture provides", vm.Name, v.ConfigMap.Name)
			}
		case v.Secret != nil:
			items = v.Secret.Items
			s, ok := fx.secrets[v.Secret.SecretName]
			if !ok {
				t.Fatalf("volume %s mounts Secret %q, which no documented fixture provides", vm.Name, v.Secret.SecretName)
			}
			data = s
		default:
			t.Fatalf("volume %s has an unexpected source", vm.Name)
		}
		if !vm.ReadOnly {
			t.Errorf("mount %s of configuration or credentials is not readOnly", vm.MountPath)
		}
		if items == nil {
			for k := range data {
				items = append(items, corev1.KeyToPath{Key: k, Path: k})
			}
		}
		for _, it := range items {
			b, ok := data[it.Key]
			if !ok {
				t.Fatalf("volume %s projects key %q, which its source does not have (the pod would not start)", vm.Name, it.Key)
			}
			if err := os.WriteFile(filepath.Join(dir, it.Path), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Longest mount first, so /etc/bigfleet/tls never swallows a deeper one.
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	env := containerEnv(t, c, fx)
	for _, a := range c.Args {
		a = expandEnv(t, a, env)
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if notInPod[name] {
			m.args = append(m.args, a)
			continue
		}
		var b strings.Builder
		last := 0
		for _, ix := range pathRE.FindAllStringIndex(a, -1) {
			if ix[1] < len(a) && strings.ContainsRune(pathChars, rune(a[ix[1]])) {
				continue // e.g. /var/lib/bigfleet-bootstrap: another path
			}
			p := a[ix[0]:ix[1]]
			if !slices.ContainsFunc(mounts, func(mp string) bool { return p == mp || strings.HasPrefix(p, mp+"/") }) {
				t.Errorf("argument %q names %s, which is under no volume mount (read-only root filesystem)", a, p)
			}
			b.WriteString(a[last:ix[0]])
			b.WriteString(filepath.Join(root, p))
			last = ix[1]
		}
		b.WriteString(a[last:])
		m.args = append(m.args, b.String())
	}
	return m
}

const pathChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

// containerEnv is the container's environment as the kubelet sets it:
// literal values, and the downward API fields the chart uses.
func containerEnv(t *testing.T, c corev1.Container, fx *fixtures) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			env[e.Name] = fx.podIP
		default:
			t.Fatalf("env %s comes from %+v, which the test does not model", e.Name, e.ValueFrom)
		}
	}
	return env
}

// envRef is a $(VAR) reference in a container argument.
var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandEnv replaces $(VAR) with the container's VAR, as the kubelet does.
// A reference to a variable the container does not define would reach the
// provider verbatim: a failure.
func expandEnv(t *testing.T, arg string, env map[string]string) string {
	t.Helper()
	return envRef.ReplaceAllStringFunc(arg, func(ref string) string {
		name := envRef.FindStringSubmatch(ref)[1]
		v, ok := env[name]
		if !ok {
			t.Errorf("argument %q refers to $(%s), which the container's env does not define", arg, name)
			return ref
		}
		return v
	})
}

// notInPod are flags whose paths live in the guest or on the libvirt
// host, not in the provider's pod.
var notInPod = map[string]bool{
	"bootstrap-path": true, "bootstrap-exec": true, "node-ready-exec": true,
	"kernel": true, "initrd": true, "kernel-cmdline": true, "image": true,
}

// parseArgs runs the provider's own flag parsing and validation on the
// materialised arguments.
func parseArgs(m materialised) (*config.Config, error) {
	var stderr bytes.Buffer
	cfg, err := config.Parse(registry, m.args, &stderr)
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, stderr.String())
	}
	return cfg, nil
}

// checkLibvirtFiles checks that the files a --connect URI names exist in
// the pod: the SSH key and known_hosts, or the TLS pkipath's three files.
// config.Parse checks the URI's shape; the dialer reads the files later.
func checkLibvirtFiles(t *testing.T, cfg *config.Config) {
	t.Helper()
	l, ok := cfg.Plugin.(*libvirt.Settings)
	if !ok {
		return // no --connect
	}
	for _, zu := range l.Connect {
		u, err := url.Parse(zu.URI)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		for _, k := range []string{"keyfile", "known_hosts"} {
			if p := q.Get(k); p != "" {
				if _, err := os.Stat(p); err != nil {
					t.Errorf("zone %s: %s=%s does not exist in the pod: %v", zu.Zone, k, p, err)
				}
			}
		}
		if p := q.Get("pkipath"); p != "" {
			for _, f := range []string{"cacert.pem", "clientcert.pem", "clientkey.pem"} {
				if _, err := os.Stat(filepath.Join(p, f)); err != nil {
					t.Errorf("zone %s: pkipath %s lacks %s: %v", zu.Zone, p, f, err)
				}
			}
		}
	}
}

// checkSecureDefaults checks what every rendering must hold.
func checkSecureDefaults(t *testing.T, r *rendered, m materialised, cfg *config.Config) {
	t.Helper()
	d := r.deployment
	spec := d.Spec.Template.Spec
	c := r.container(t)
	if cfg.Etcd == nil {
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
			t.Errorf("replicas %v, want exactly 1", d.Spec.Replicas)
		}
		if d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			t.Errorf("strategy %q, want Recreate", d.Spec.Strategy.Type)
		}
		if len(r.pdbs) != 0 {
			t.Errorf("%d PodDisruptionBudgets for a single replica", len(r.pdbs))
		}
	} else {
		checkHA(t, r, m, cfg)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("pod automountServiceAccountToken %v, want false", spec.AutomountServiceAccountToken)
	}
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and seccomp RuntimeDefault", psc)
	}
	sc := c.SecurityContext
	switch {
	case sc == nil:
		t.Fatal("no container securityContext")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("root filesystem is not read-only")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("privilege escalation is allowed")
	case sc.Capabilities == nil || !cmp.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		t.Errorf("capabilities %+v, want drop ALL and add none", sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Error("container seccomp profile is not RuntimeDefault")
	}
	for _, v := range spec.Volumes {
		if v.Secret != nil && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0) {
			t.Errorf("Secret volume %s is readable by others (defaultMode %v)", v.Name, v.Secret.DefaultMode)
		}
	}
	for _, sa := range r.accounts {
		if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			t.Errorf("ServiceAccount %s mounts its token", sa.Name)
		}
	}

	// Ports and probes agree with the flags the binary got.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if got := fmt.Sprintf(":%d", ports["grpc"]); got != cfg.Addr {
		t.Errorf("grpc containerPort %s, provider --addr %s", got, cfg.Addr)
	}
	if got := fmt.Sprintf(":%d", ports["metrics"]); got != cfg.MetricsAddr {
		t.Errorf("metrics containerPort %s, provider --metrics-addr %s", got, cfg.MetricsAddr)
	}
	for _, pr := range []struct {
		name string
		p    *corev1.Probe
		path string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}, {"startup", c.StartupProbe, "/healthz"}} {
		if pr.p == nil || pr.p.HTTPGet == nil || pr.p.HTTPGet.Path != pr.path || pr.p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe %+v, want GET %s on the metrics port", pr.name, pr.p, pr.path)
		}
	}
	svcPorts := map[string]int32{}
	for _, p := range r.service.Spec.Ports {
		svcPorts[p.Name] = p.Port
	}
	if diff := cmp.Diff(ports, svcPorts); diff != "" {
		t.Errorf("Service ports differ from container ports (-container +service):\n%s", diff)
	}

	// The read-only root needs a writable /tmp (the libvirt cloud-init
	// seed is built there) and, with --state, a writable state directory.
	if _, ok := m.writable["/tmp"]; !ok {
		t.Error("no writable /tmp volume")
	}
	if cfg.StatePath != "" && cfg.Etcd == nil {
		dir := strings.TrimPrefix(filepath.Dir(cfg.StatePath), m.root)
		if _, ok := m.writable[dir]; !ok {
			t.Errorf("--state %s is not on a writable volume (writable: %v)", cfg.StatePath, m.writable)
		}
	}
	if !strings.Contains(r.notes, "port-forward") || !strings.Contains(r.notes, "provider plan --server http://127.0.0.1:") {
		t.Errorf("NOTES.txt lacks the port-forward or provider plan --server command:\n%s", r.notes)
	}
}

func hasArg(c corev1.Container, arg string) bool { return slices.Contains(c.Args, arg) }

// checkHA checks what every rendering with ha.enabled must hold: several
// replicas, a rollout that cannot wait on a standby's readiness, no state
// volume, an advertised pod address, replicas kept apart, and a budget
// that never evicts the only Ready pod (the leader).
func checkHA(t *testing.T, r *rendered, m materialised, cfg *config.Config) {
	t.Helper()
	d := r.deployment
	spec := d.Spec.Template.Spec
	c := r.container(t)
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("ha replicas %v, want at least 2", d.Spec.Replicas)
	}
	replicas := int(*d.Spec.Replicas)
	// A standby never turns Ready while the leader lives, so every old pod
	// must be allowed to go without a new one being Ready, or the rollout
	// stalls with the old leader in place.
	if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || d.Spec.Strategy.RollingUpdate == nil {
		t.Fatalf("ha strategy %+v, want RollingUpdate", d.Spec.Strategy)
	}
	unavailable, err := intstr.GetScaledValueFromIntOrPercent(d.Spec.Strategy.RollingUpdate.MaxUnavailable, replicas, true)
	if err != nil || unavailable < replicas {
		t.Errorf("ha maxUnavailable %v (%d of %d replicas, %v): a rollout would wait for a standby to turn Ready", d.Spec.Strategy.RollingUpdate.MaxUnavailable, unavailable, replicas, err)
	}
	if _, ok := m.writable["/var/lib/bigfleet"]; ok || len(r.pvcs) != 0 {
		t.Errorf("ha with a state volume (%v) or PVCs (%d): the state lives in etcd", m.writable, len(r.pvcs))
	}
	if !strings.HasPrefix(cfg.StatePath, "etcd://") {
		t.Errorf("ha --state %q, want etcd://", cfg.StatePath)
	}
	host, port, err := net.SplitHostPort(cfg.Etcd.Identity)
	if err != nil || net.ParseIP(host) == nil || fmt.Sprintf(":%s", port) != cfg.Addr {
		t.Errorf("ha --advertise-addr resolves to %q, want <pod IP>%s", cfg.Etcd.Identity, cfg.Addr)
	}
	if rp := c.ReadinessProbe; rp == nil || rp.PeriodSeconds != 1 {
		t.Errorf("ha readiness probe %+v, want one every second (the Service follows the leader by it)", rp)
	}
	pod := labels.Set(d.Spec.Template.Labels)
	var aa *corev1.PodAntiAffinity
	if spec.Affinity != nil {
		aa = spec.Affinity.PodAntiAffinity
	}
	var terms []corev1.PodAffinityTerm
	if aa != nil {
		terms = append(terms, aa.RequiredDuringSchedulingIgnoredDuringExecution...)
		for _, w := range aa.PreferredDuringSchedulingIgnoredDuringExecution {
			terms = append(terms, w.PodAffinityTerm)
		}
	}
	if len(terms) != 1 {
		t.Fatalf("ha pod anti-affinity %+v, want one term", aa)
	}
	sel, err := metav1.LabelSelectorAsSelector(terms[0].LabelSelector)
	if err != nil || !sel.Matches(pod) || terms[0].TopologyKey == "" {
		t.Errorf("ha anti-affinity term %+v does not keep the release's own pods apart", terms[0])
	}
	for _, pdb := range r.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || !sel.Matches(pod) {
			t.Errorf("PodDisruptionBudget selector %v does not select the pods", pdb.Spec.Selector)
		}
		if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || pdb.Spec.MaxUnavailable != nil {
			t.Errorf("PodDisruptionBudget minAvailable %v maxUnavailable %v, want minAvailable 1", pdb.Spec.MinAvailable, pdb.Spec.MaxUnavailable)
		}
		// Standbys are never Ready: they must stay evictable.
		if p := pdb.Spec.UnhealthyPodEvictionPolicy; p == nil || *p != policyv1.AlwaysAllow {
			t.Errorf("PodDisruptionBudget unhealthyPodEvictionPolicy %v, want AlwaysAllow", p)
		}
	}
	for _, w := range []string{"elect one leader", "delete pod LEADER-POD", "port-forward pod/LEADER-POD", "provider plan --server"} {
		if !strings.Contains(r.notes, w) {
			t.Errorf("ha NOTES lack %q:\n%s", w, r.notes)
		}
	}
	if strings.Contains(r.notes, "WARNING: state") {
		t.Errorf("ha NOTES warn about the local state:\n%s", r.notes)
	}
}

type chartCase struct {
	name    string
	release string
	files   []string
	set     []string
	setFile []string // key=path; path relative to testdata, or "{ca}" for the generated CA
	// renderErr: the chart must refuse with these substrings.
	renderErr []string
	// parseErr: the chart renders, and the provider must refuse the args.
	parseErr string
	check    func(t *testing.T, r *rendered, m materialised, cfg *config.Config, fx *fixtures)
}

func chartCases() []chartCase {
	return []chartCase{
		{name: "seed dc1 values", release: "bigfleet-libvirt-dc1", files: []string{"dc1.values.yaml"},
			check: func(t *testing.T, r *rendered, m materialised, cfg *config.Config, fx *fixtures) {
				if r.deployment.Name != "bigfleet-libvirt-dc1" {
					t.Errorf("Deployment %q, want the release name (kubectl logs deploy/bigfleet-libvirt-dc1)", r.deployment.Name)
				}
				c := r.container(t)
				if c.Image != "ghcr.io/your-org/bigfleet-libvirt:latest" {
					t.Errorf("image %q", c.Image)
				}
				if len(r.configMaps) != 0 {
					t.Errorf("ConfigMap rendered without content: %v", r.configMaps)
				}
				if cfg.Hypervisor != "libvirt" || cfg.Backend != "libvirt" || cfg.Provider != "libvirt-dc1" {
					t.Errorf("hypervisor %s backend %s provider %s", cfg.Hypervisor, cfg.Backend, cfg.Provider)
				}
				if diff := cmp.Diff([]string{"rack1", "rack2"}, cfg.Zones); diff != "" {
					t.Errorf("zones (-want +got):\n%s", diff)
				}
				if l := cfg.Plugin.(*libvirt.Settings); l.Image != "ubuntu-24.04.qcow2" || l.StoragePool != "default" || l.Network != "default" {
					t.Errorf("libvirt %+v", l)
				}
				if m.writable["/var/lib/bigfleet"] != "pvc" || len(r.pvcs) != 1 {
					t.Fatalf("state volume %q, %d PVCs; want a PVC", m.writable["/var/lib/bigfleet"], len(r.pvcs))
				}
				pvc := r.pvcs[0]
				if pvc.Name != "bigfleet-libvirt-dc1-state" || !cmp.Equal(pvc.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}) ||
					!pvc.Spec.Resources.Requests.Storage().Equal(resource.MustParse("1Gi")) || pvc.Spec.StorageClassName != nil {
					t.Errorf("PVC %s %v %v class %v", pvc.Name, pvc.Spec.AccessModes, pvc.Spec.Resources.Requests, pvc.Spec.StorageClassName)
				}
				if pvc.Annotations["helm.sh/resource-policy"] != "keep" {
					t.Error("the state PVC is deleted by helm uninstall")
				}
				if cfg.TLS.Enabled() {
					t.Error("TLS enabled without tls values")
				}
				want := map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "9090", "prometheus.io/path": "/metrics"}
				if diff := cmp.Diff(want, r.service.Annotations); diff != "" {
					t.Errorf("Service annotations (-want +got):\n%s", diff)
				}
				if len(r.monitors)+len(r.rules) != 0 {
					t.Error("monitoring objects rendered by default")
				}
				for _, w := range []string{"kubectl -n bigfleet port-forward deploy/bigfleet-libvirt-dc1 9090:9090", "provider plan --server http://127.0.0.1:9090", "plaintext gRPC"} {
					if !strings.Contains(r.notes, w) {
						t.Errorf("NOTES lacks %q:\n%s", w, r.notes)
					}
				}
			}},
		{name: "seed dc1 with offerings via --set-file", release: "bigfleet-libvirt-dc1", files: []string{"dc1.values.yaml"},
			setFile: []string{"offerings.content=offerings.dc1.json"},
			check: func(t *testing.T, r *rendered, m materialised, cfg *config.Config, fx *fixtures) {
				want, _ := os.ReadFile("testdata/offerings.dc1.json")
				cm := r.configMaps["bigfleet-libvirt-dc1-config"]
				if cm == nil || strings.TrimSpace(cm.Data["offerings.json"]) != strings.TrimSpace(string(want)) {
					t.Fatalf("offerings ConfigMap %+v", cm)
				}
				if !hasArg(r.container(t), "--offerings=/etc/bigfleet/offerings/offerings.json") {
					t.Error("no --offerings at the documented path")
				}
				if len(cfg.Offerings) != 2 || len(cfg.Slots) != 12 {
					t.Errorf("%d offerings, %d slots; want 2 and 12", len(cfg.Offerings), len(cfg.Slots))
				}
				if r.deployment.Spec.Template.Annotations["checksum/config"] == "" {
					t.Error("no checksum/config annotation: a changed offerings file would not roll the pod")
				}
			}},
		{name: "tls and mtls", release: "bigfleet-libvirt-dc1", files: []string{"dc1.values.yaml", "tls-mtls.values.yaml"},
			check: func(t *testing.T, r *rendered, m materialised, cfg *config.Config, fx *fixtures) {
				if !cfg.TLS.Enabled() || !cfg.TLS.Mutual() {
					t.Errorf("TLS %+v, want mTLS", cfg.TLS)
				}
				if !strings.HasSuffix(cfg.TLS.CA, "/etc/bigfleet/tls/ca.crt") {
					t.Errorf("--tls-ca %s", cfg.TLS.CA)
				}
				if !strings.Contains(r.notes, "mTLS") {
					t.Errorf("NOTES do not mention mTLS:\n%s", r.notes)
				}
			}},
		{name: "tls without client certificates", release: "bigfleet-libvirt-dc1", files: []string{"dc1.values.yaml", "tls-only.values.yaml"},
			check: func(t *testing.T, r *rendered, m materialised, cfg *config.Config, fx *fixtures) {
				if !cfg.TLS.Enabled() || cfg.TLS.Mutual() {
					t.Errorf("TLS %+v, want server TLS only", cfg.TLS)
				}
				if _, err := os.Stat(filepath.Join(m.root, "/etc/bigfleet/tls/ca.crt")); err == nil {
					t.Error("ca.crt mounted without mtls")
				}
			}},
		{name: "state off", release: "bigfleet-libvirt-dc1", files: []string{"dc1.values.yaml"},
			set: []string{"state.enabled=false", "state.persistence.enabled=false"},
			check: func(t *testing.T, r *rendered, m materialised, cfg *config.Config, fx *fixtures) {
				if cfg.StatePath != "" || len(r.pvcs) != 0 {
					t.Errorf("state %q, %d PVCs; want in-memory", cfg.StatePath, len(r.pvcs))
				}
				if _, ok := m.writable["/var/lib/bigfleet"]; ok {
					t.Error("state volume mounted with state off")
				}
				if !strings.Contains(r.notes, "WARNING: state.enabled is false") {
					t.Errorf("NOTES do not warn about in-memory state:\n%s", r.notes)
				}
			}},
		{name: "libvirt over tls, emptyDir state, bare metal, cloud-init", release: "lab", files: []string{"libvirt-tls.values.yaml"},
			check: func(t *testing.T, r *rendered, m materialised, cfg *config.Config, fx *fixtures) {
				c := r.container(t)
				if c.Image != "registry.example.internal/bigfleet-provider@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" {
					t.Errorf("image %q", c.Image)
				}
				if diff := cmp.Diff([]string{"lab1"}, cfg.Zones); diff != "" {
					t.Errorf("zones (-want +got):\n%s", diff)
				}
				l := cfg.Plugin.(*libvirt.Settings)
				if l.StoragePool != "vms" || l.Network != "br0" || l.DomainType != "qemu" || !cfg.BareMetal {
					t.Errorf("libvirt %+v bare_metal %t", l, cfg.BareMetal)
				}
				if !strings.Contains(string(l.BaseUserData), "systemctl enable --now qemu-guest-agent") {
					t.Errorf("base user data %q", l.BaseUserData)
				}
				if m.writable["/var/lib/bigfleet"] != "emptyDir" || len(r.pvcs) != 0 {
					t.Errorf("state volume %q with %d PVCs, want an emptyDir", m.writable["/var/lib/bigfleet"], len(r.pvcs))
				}
				if len(cfg.Slots) != 6 || cfg.ReconcileInterval != 30*time.Second || cfg.LogFormat != "text" {
					t.Errorf("slots %d interval %s log %s", len(cfg.Slots), cfg.ReconcileInterval, cfg.LogFormat)
				}
				if !strings.Contains(r.notes, "emptyDir") {
					t.Errorf("NOTES do not warn about emptyDir state:\n%s", r.notes)
				}
			}},
		{name: "ha over etcd with mutual TLS", release: "bigfleet-libvirt-dc1", files: []string{"dc1.values.yaml", "ha.values.yaml"},
			check: func(t *testing.T, r *rendered, m materialised, cfg *config.Config, fx *fixtures) {
				e := cfg.Etcd
				want := []string{"etcd-0.etcd.bigfleet.svc:2379", "etcd-1.etcd.bigfleet.svc:2379", "etcd-2.etcd.bigfleet.svc:2379"}
				if diff := cmp.Diff(want, e.Endpoints); diff != "" {
					t.Errorf("etcd endpoints (-want +got):\n%s", diff)
				}
				if e.Prefix != "/bigfleet/libvirt-dc1" || e.LeaseTTL != 5*time.Second || e.Identity != fx.podIP+":9000" {
					t.Errorf("etcd prefix %q lease %v identity %q", e.Prefix, e.LeaseTTL, e.Identity)
				}
				for flag, f := range map[string]string{"--etcd-ca-file": e.CAFile, "--etcd-cert-file": e.CertFile, "--etcd-key-file": e.KeyFile} {
					if !strings.HasPrefix(f, filepath.Join(m.root, "/etc/bigfleet/etcd-tls")+"/") {
						t.Errorf("%s %q, want a file of the etcd-tls mount", flag, f)
					}
				}
				if *r.deployment.Spec.Replicas != 2 || len(r.pdbs) != 1 {
					t.Errorf("%d replicas, %d PodDisruptionBudgets; want 2 and 1", *r.deployment.Spec.Replicas, len(r.pdbs))
				}
				aa := r.deployment.Spec.Template.Spec.Affinity.PodAntiAffinity
				if len(aa.PreferredDuringSchedulingIgnoredDuringExecution) != 1 || len(aa.RequiredDuringSchedulingIgnoredDuringExecution) != 0 ||
					aa.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" {
					t.Errorf("anti-affinity %+v, want preferred over kubernetes.io/hostname", aa)
				}
				if !strings.Contains(r.notes, "/bigfleet/libvirt-dc1") {
					t.Errorf("NOTES do not name the etcd prefix:\n%s", r.notes)
				}
			}},
		{name: "ha: required anti-affinity and server-authenticated etcd with three replicas under the default prefix", release: "bigfleet-libvirt-dc1",
			files: []string{"dc1.values.yaml", "ha.values.yaml"},
			set: []string{"ha.replicas=3", "ha.antiAffinity.mode=required", "ha.antiAffinity.topologyKey=topology.kubernetes.io/zone",
				"ha.etcd.tls.clientCert=false", "ha.etcd.prefix=", "ha.leaderLease=10s", "ha.podDisruptionBudget.enabled=false"},
			check: func(t *testing.T, r *rendered, m materialised, cfg *config.Config, fx *fixtures) {
				e := cfg.Etcd
				if e.Prefix != "/bigfleet/bigfleet/bigfleet-libvirt-dc1" || e.LeaseTTL != 10*time.Second || e.CAFile == "" || e.CertFile != "" || e.KeyFile != "" {
					t.Errorf("etcd %+v, want the default prefix, a 10s lease and a CA only", e)
				}
				if _, err := os.Stat(filepath.Join(m.root, "/etc/bigfleet/etcd-tls/tls.key")); err == nil {
					t.Error("the client key is mounted without clientCert")
				}
				aa := r.deployment.Spec.Template.Spec.Affinity.PodAntiAffinity
				if len(aa.RequiredDuringSchedulingIgnoredDuringExecution) != 1 || len(aa.PreferredDuringSchedulingIgnoredDuringExecution) != 0 ||
					aa.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey != "topology.kubernetes.io/zone" {
					t.Errorf("anti-affinity %+v, want required over topology.kubernetes.io/zone", aa)
				}
				if *r.deployment.Spec.Replicas != 3 || len(r.pdbs) != 0 {
					t.Errorf("%d replicas, %d PodDisruptionBudgets; want 3 and none", *r.deployment.Spec.Replicas, len(r.pdbs))
				}
			}},
		{name: "ha: plain etcd on the simulator with the operator's node affinity", release: "demo", files: []string{"simulator.values.yaml"},
			set: []string{"state.enabled=false", "ha.enabled=true", "ha.etcd.endpoints={127.0.0.1:2379}"},
			check: func(t *testing.T, r *rendered, m materialised, cfg *config.Config, fx *fixtures) {
				e := cfg.Etcd
				if e.CAFile != "" || cfg.StatePath != "etcd://127.0.0.1:2379/bigfleet/bigfleet/demo" {
					t.Errorf("state %q, etcd %+v; want plain TCP under the default prefix", cfg.StatePath, e)
				}
				aff := r.deployment.Spec.Template.Spec.Affinity
				if aff.NodeAffinity == nil || aff.PodAntiAffinity == nil {
					t.Errorf("affinity %+v, want the operator's node affinity and the replicas' anti-affinity", aff)
				}
				for _, v := range r.deployment.Spec.Template.Spec.Volumes {
					if v.Name == "etcd-tls" {
						t.Error("etcd-tls volume without a Secret")
					}
				}
			}},
		{name: "proxmox", release: "bigfleet-proxmox-dc1", files: []string{"proxmox.values.yaml"},
			setFile: []string{"proxmox.ca.content={ca}"},
			check: func(t *testing.T, r *rendered, m materialised, cfg *config.Config, fx *fixtures) {
				x := cfg.Plugin.(*proxmox.Settings)
				if cfg.Hypervisor != "proxmox" || cfg.Backend != "proxmox" || cfg.Provider != "proxmox-dc1" {
					t.Errorf("hypervisor %s backend %s provider %s", cfg.Hypervisor, cfg.Backend, cfg.Provider)
				}
				if x.TokenSecret.Reveal() != fx.token || x.TokenID != "bigfleet@pve!autoscaler" || x.Pool != "bigfleet" || x.TemplateVMID != 9000 {
					t.Errorf("proxmox %+v", x)
				}
				if diff := cmp.Diff([]string{"pve1", "pve2", "pve3"}, cfg.Zones); diff != "" {
					t.Errorf("zones (-want +got):\n%s", diff)
				}
				if !strings.HasSuffix(x.CAFile, "/etc/bigfleet/proxmox-ca/ca.pem") || !cfg.TLS.Mutual() {
					t.Errorf("ca file %s, tls %+v", x.CAFile, cfg.TLS)
				}
				for _, a := range r.container(t).Args {
					if strings.Contains(a, fx.token) {
						t.Errorf("the token secret is in the pod's args: %s", a)
					}
				}
				if len(r.pvcs) != 1 || r.pvcs[0].Spec.StorageClassName == nil || *r.pvcs[0].Spec.StorageClassName != "fast-ssd" ||
					!r.pvcs[0].Spec.Resources.Requests.Storage().Equal(resource.MustParse("2Gi")) {
					t.Errorf("PVC %+v", r.pvcs)
				}
				if r.deployment.Labels["bigfleet.io/hypervisor"] != "proxmox" {
					t.Errorf("labels %v", r.deployment.Labels)
				}
			}},
		{name: "proxmox with fingerprint, external CA, catalog and prices", release: "pve-lab", files: []string{"proxmox-fingerprint.values.yaml"},
			check: func(t *testing.T, r *rendered, m materialised, cfg *config.Config, fx *fixtures) {
				x := cfg.Plugin.(*proxmox.Settings)
				if x.Fingerprint != strings.Repeat("abcdef0123456789", 4) {
					t.Errorf("fingerprint %q", x.Fingerprint)
				}
				if x.TokenSecret.Reveal() != fx.token || x.BootstrapPath != "/var/lib/bigfleet-bootstrap" || !cmp.Equal(x.BootstrapExec, []string{"/usr/bin/python3"}) {
					t.Errorf("proxmox %+v", x)
				}
				if it, ok := cfg.Catalog["pve.gpu"]; !ok || it.Source != 9100 || it.VCPU != 8 {
					t.Errorf("catalog %+v", cfg.Catalog)
				}
				if !hasArg(r.container(t), "--prices=pve.gpu=0.9,pve.small=0.011") || cfg.Reflection {
					t.Errorf("args %v reflection %t", r.container(t).Args, cfg.Reflection)
				}
				if cfg.StatePath != "" {
					t.Errorf("state %q", cfg.StatePath)
				}
			}},
		{name: "simulator with monitoring and scheduling", release: "demo", files: []string{"simulator.values.yaml"},
			check: func(t *testing.T, r *rendered, m materialised, cfg *config.Config, fx *fixtures) {
				if cfg.Backend != config.BackendFake || cfg.Fake.Latency != 50*time.Millisecond || cfg.Timeouts.Drain != 20*time.Minute {
					t.Errorf("backend %s fake %+v drain %s", cfg.Backend, cfg.Fake, cfg.Timeouts.Drain)
				}
				if len(r.monitors) != 1 || len(r.rules) != 1 {
					t.Fatalf("%d ServiceMonitors, %d PrometheusRules", len(r.monitors), len(r.rules))
				}
				if ep := r.monitors[0].Spec.Endpoints; len(ep) != 1 || ep[0].Port != "metrics" || ep[0].Path != "/metrics" {
					t.Errorf("ServiceMonitor endpoints %+v", ep)
				}
				if r.rules[0].Labels["release"] != "kube-prometheus-stack" {
					t.Errorf("PrometheusRule labels %v", r.rules[0].Labels)
				}
				var file struct {
					Groups []monitoringv1.RuleGroup `json:"groups"`
				}
				b, err := os.ReadFile("helm/files/alerts.yaml")
				if err != nil {
					t.Fatal(err)
				}
				if err := yaml.UnmarshalStrict(b, &file); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(file.Groups, r.rules[0].Spec.Groups); diff != "" {
					t.Errorf("PrometheusRule differs from files/alerts.yaml (-file +rendered):\n%s", diff)
				}
				if len(r.accounts) != 0 || r.deployment.Spec.Template.Spec.ServiceAccountName != "bigfleet" {
					t.Errorf("service accounts %d, name %q", len(r.accounts), r.deployment.Spec.Template.Spec.ServiceAccountName)
				}
				spec := r.deployment.Spec.Template.Spec
				if spec.NodeSelector["kubernetes.io/os"] != "linux" || len(spec.Tolerations) != 1 || spec.Affinity == nil || spec.Affinity.NodeAffinity == nil {
					t.Errorf("scheduling %v %v %v", spec.NodeSelector, spec.Tolerations, spec.Affinity)
				}
				if lim := r.container(t).Resources.Limits[corev1.ResourceMemory]; !lim.Equal(resource.MustParse("256Mi")) {
					t.Errorf("memory limit %v", lim)
				}
				if !strings.Contains(r.notes, "WARNING: simulator is true") {
					t.Errorf("NOTES do not warn about the simulator:\n%s", r.notes)
				}
			}},

		// The chart refuses what it can see is wrong.
		{name: "typo in a key", files: []string{"dc1.values.yaml"}, set: []string{"libvirt.storagePol=vms"},
			renderErr: []string{"storagePol", "values don't meet the specifications of the schema"}},
		{name: "typo at the top level", files: []string{"dc1.values.yaml"}, set: []string{"presistence.enabled=true"},
			renderErr: []string{"presistence"}},
		{name: "wrong type", files: []string{"dc1.values.yaml"}, set: []string{"state.enabled=yes"},
			renderErr: []string{"/state/enabled", "want boolean"}},
		{name: "unknown hypervisor", files: []string{"dc1.values.yaml"}, set: []string{"hypervisor=xen"},
			renderErr: []string{"hypervisor"}},
		{name: "bad reconcile interval", files: []string{"dc1.values.yaml"}, set: []string{"reconcileInterval=2 minutes"},
			renderErr: []string{"reconcileInterval"}},
		{name: "ha: state volume too", files: []string{"dc1.values.yaml"}, set: []string{"ha.enabled=true", "ha.etcd.endpoints={etcd-0:2379}"},
			renderErr: []string{"ha.enabled keeps the state in etcd"}},
		{name: "ha: no etcd endpoints", files: []string{"dc1.values.yaml", "ha.values.yaml"}, set: []string{"ha.etcd.endpoints=null"},
			renderErr: []string{"ha.enabled needs ha.etcd.endpoints"}},
		{name: "ha: one replica", files: []string{"dc1.values.yaml", "ha.values.yaml"}, set: []string{"ha.replicas=1"},
			renderErr: []string{"/ha/replicas"}},
		{name: "ha: unknown anti-affinity mode", files: []string{"dc1.values.yaml", "ha.values.yaml"}, set: []string{"ha.antiAffinity.mode=soft"},
			renderErr: []string{"/ha/antiAffinity/mode"}},
		{name: "ha: an endpoint with a scheme", files: []string{"dc1.values.yaml", "ha.values.yaml"}, set: []string{"ha.etcd.endpoints={https://etcd-0:2379}"},
			renderErr: []string{"/ha/etcd/endpoints"}},
		{name: "ha: a prefix ending in a slash", files: []string{"dc1.values.yaml", "ha.values.yaml"}, set: []string{"ha.etcd.prefix=/bigfleet/"},
			renderErr: []string{"/ha/etcd/prefix"}},
		{name: "ha: etcd values without ha", files: []string{"dc1.values.yaml"}, set: []string{"ha.etcd.endpoints={etcd-0:2379}"},
			renderErr: []string{"ha.etcd.* is set but ha.enabled is false"}},
		{name: "libvirt needs connect and image", set: []string{"provider=libvirt-dc1"},
			renderErr: []string{"connect is required", "libvirt.image is required"}},
		{name: "mtls without tls", files: []string{"dc1.values.yaml"}, set: []string{"tls.mtls=true"},
			renderErr: []string{"tls.mtls needs tls.enabled"}},
		{name: "ssh key paths without the Secret", files: []string{"dc1.values.yaml"}, set: []string{"credentials.ssh.secretName="},
			renderErr: []string{"credentials.ssh.secretName is empty"}},
		{name: "proxmox needs its credentials", set: []string{"proxmox.apiUrl=https://pve1.example.internal:8006/api2/json"},
			renderErr: []string{"proxmox.tokenId is required", "proxmox.tokenSecret.name is required", "proxmox.nodes is required", "verify the API certificate"}},
		{name: "plain http proxmox", files: []string{"proxmox.values.yaml"}, set: []string{"proxmox.apiUrl=http://pve1:8006/api2/json"},
			renderErr: []string{"apiUrl"}},
		{name: "both hypervisors", files: []string{"dc1.values.yaml"}, set: []string{"hypervisor=libvirt", "proxmox.nodes={pve1}"},
			renderErr: []string{"proxmox.* is set but the hypervisor is libvirt"}},
		{name: "persistence without state", files: []string{"dc1.values.yaml"}, set: []string{"state.enabled=false"},
			renderErr: []string{"state.persistence.enabled needs state.enabled"}},

		// What the chart cannot see, the provider's own validation catches.
		{name: "an extra flag the binary does not have", release: "x", files: []string{"dc1.values.yaml"}, set: []string{"extraArgs={--reconcile-intervall=1m}"},
			parseErr: "flag provided but not defined: -reconcile-intervall"},
		{name: "an insecure libvirt transport", release: "x", files: []string{"dc1.values.yaml"}, set: []string{"connect=qemu+tcp://host-a/system"},
			parseErr: "plain TCP"},
		{name: "offerings naming an unknown zone", release: "x", files: []string{"dc1.values.yaml"},
			set: []string{`offerings.content=[{"instance_type":"kvm.small"\,"zone":"rack9"\,"count":1}]`}, parseErr: "rack9"},
		{name: "ha: a lease out of range", files: []string{"dc1.values.yaml", "ha.values.yaml"}, set: []string{"ha.leaderLease=90s"},
			renderErr: []string{"/ha/leaderLease"}},
	}
}

// TestChart renders every case, decodes every object strictly, lays the
// pod's files out, and runs the provider's own config validation on the
// container arguments: the chart can never pass a flag the binary rejects
// or miss one it needs.
func TestChart(t *testing.T) {
	fx := newFixtures(t)
	caFile := filepath.Join(t.TempDir(), "pve-root-ca.pem")
	if err := os.WriteFile(caFile, []byte(fx.caPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range chartCases() {
		t.Run(tc.name, func(t *testing.T) {
			var setFile []string
			for _, sf := range tc.setFile {
				k, p, _ := strings.Cut(sf, "=")
				if p == "{ca}" {
					p = caFile
				} else {
					p = filepath.Join("testdata", p)
				}
				setFile = append(setFile, k+"="+p)
			}
			release := tc.release
			if release == "" {
				release = "bad"
			}
			r, err := renderChart(release, "bigfleet", tc.files, tc.set, setFile)
			if len(tc.renderErr) > 0 {
				if err == nil {
					t.Fatalf("rendered, want an error mentioning %q", tc.renderErr)
				}
				for _, w := range tc.renderErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error does not mention %q:\n%v", w, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			m := materialise(t, r, fx)
			cfg, err := parseArgs(m)
			if tc.parseErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.parseErr) {
					t.Fatalf("config.Parse of the rendered args: %v, want an error mentioning %q", err, tc.parseErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("the provider rejects the args the chart renders %q:\n%v", r.container(t).Args, err)
			}
			checkLibvirtFiles(t, cfg)
			checkSecureDefaults(t, r, m, cfg)
			tc.check(t, r, m, cfg, fx)
		})
	}
}

// TestChartLint runs helm lint (strict: warnings fail) with the seed's
// values, with the defaults plus the simulator, and in HA mode.
func TestChartLint(t *testing.T) {
	for _, files := range [][]string{{"dc1.values.yaml"}, {"simulator.values.yaml"}, {"proxmox-fingerprint.values.yaml"}, {"dc1.values.yaml", "ha.values.yaml"}} {
		opts := values.Options{}
		for _, f := range files {
			opts.ValueFiles = append(opts.ValueFiles, filepath.Join("testdata", "values", f))
		}
		vals, err := opts.MergeValues(getter.Providers{})
		if err != nil {
			t.Fatal(err)
		}
		l := action.NewLint()
		l.Strict = true
		l.Namespace = "bigfleet"
		res := l.Run([]string{chartDir}, vals)
		for _, msg := range res.Messages {
			t.Logf("lint %v: %s", files, msg)
		}
		if len(res.Errors) > 0 {
			t.Errorf("helm lint %v: %v", files, res.Errors)
		}
	}
}

// TestChartDefaultsDocumented checks that values.yaml and the schema name
// the same keys, so every value an operator can set is both documented
// (values.yaml comments) and typo-checked (the schema).
func TestChartDefaultsDocumented(t *testing.T) {
	var vals map[string]any
	b, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &vals); err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	b, err = os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var inValues, inSchema []string
	var walkV func(prefix string, v map[string]any)
	walkV = func(prefix string, v map[string]any) {
		for k, x := range v {
			inValues = append(inValues, prefix+k)
			if m, ok := x.(map[string]any); ok && len(m) > 0 && !freeForm[prefix+k] {
				walkV(prefix+k+".", m)
			}
		}
	}
	var walkS func(prefix string, s map[string]any)
	walkS = func(prefix string, s map[string]any) {
		props, _ := s["properties"].(map[string]any)
		for k, x := range props {
			if k == "global" {
				continue
			}
			inSchema = append(inSchema, prefix+k)
			if m, ok := x.(map[string]any); ok && !freeForm[prefix+k] {
				walkS(prefix+k+".", m)
			}
		}
	}
	walkV("", vals)
	walkS("", schema)
	sort.Strings(inValues)
	sort.Strings(inSchema)
	if diff := cmp.Diff(inSchema, inValues); diff != "" {
		t.Errorf("keys of values.schema.json and values.yaml differ (-schema +values):\n%s", diff)
	}
}

// freeForm values are maps whose keys are the operator's (labels,
// resources, Kubernetes objects), not chart settings.
var freeForm = map[string]bool{
	"resources": true, "podSecurityContext": true, "securityContext": true, "nodeSelector": true, "affinity": true,
	"podAnnotations": true, "podLabels": true, "prices": true, "service.annotations": true,
	"serviceMonitor.labels": true, "prometheusRule.labels": true, "serviceAccount.annotations": true,
}
