package shipping

// Tests of what ships around the binary: the Dockerfile, the compose stacks
// of examples/compose, the Kubernetes manifests of examples/kubernetes
// (checked statically: every file parses, every path, port, service and
// rule they reference exists, and every exporter configuration passes
// --config.check), the example prompts and the Makefile's version stamp.
// Sharded replicas replaying one trace between them are a whole-program
// scenario, in internal/e2e (shard_test.go).
//
// examples/kubernetes/40-prometheusrule.yml and 50-grafana-dashboards.yml
// are generated from dashboards/: after changing a dashboard or a rule, run
//
//	KVLOAD_UPDATE_EXAMPLES=1 go test -run '^TestShippingKubernetes$' ./internal/shipping

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kvload-exporter/kvload-exporter/config"
	"github.com/kvload-exporter/kvload-exporter/internal/cli"
)

const (
	shippingRoot    = "../.."
	shippingPort    = 9812
	shippingCompose = "../../examples/compose"
	shippingK8s     = "../../examples/kubernetes"
)

// shippingDashboards are the dashboards every stack must ship, as in dashboards/.
var shippingDashboards = []string{"kvload-cache.json", "kvload-overview.json"}

// TestShippingExamplesParse: every YAML (all documents) and JSON file under
// examples/ parses.
func TestShippingExamplesParse(t *testing.T) {
	n := 0
	err := filepath.WalkDir(filepath.Join(shippingRoot, "examples"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch filepath.Ext(p) {
		case ".yml", ".yaml":
			shippingYAMLDocs(t, p)
		case ".json":
			var v any
			if err := json.Unmarshal(shippingRead(t, p), &v); err != nil {
				t.Errorf("%s: %v", p, err)
			}
		default:
			return nil
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 20 {
		t.Errorf("only %d YAML and JSON files under examples/", n)
	}
}

// --- Dockerfile -------------------------------------------------------

// dockerInstr is one Dockerfile instruction, continuation lines joined.
type dockerInstr struct {
	cmd  string // upper case
	args string
}

func shippingDockerfile(t *testing.T) []dockerInstr {
	t.Helper()
	var out []dockerInstr
	var cur strings.Builder
	for _, line := range strings.Split(string(shippingRead(t, filepath.Join(shippingRoot, "Dockerfile"))), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, dockerInstr{strings.ToUpper(cmd), strings.Join(strings.Fields(args), " ")})
		cur.Reset()
	}
	return out
}

// shippingImage is what the Dockerfile puts into the final image.
type shippingImage struct {
	files      map[string]string // path in the image → path in the repository
	entrypoint []string
}

// host maps a path in the image to the repository.
func (im shippingImage) host(p string) (string, bool) {
	for dst, src := range im.files {
		if p == dst {
			return src, true
		}
		if dir := strings.TrimSuffix(dst, "/") + "/"; strings.HasPrefix(p, dir) {
			return filepath.Join(src, strings.TrimPrefix(p, dir)), true
		}
	}
	return "", false
}

// TestShippingDockerfile checks the Dockerfile statically (no Docker engine
// here): the stages, a static build stamped with the version, every Go
// package and example file copied (and not excluded by .dockerignore), the
// port, the entrypoint, and the default configuration, which must pass
// --config.check with its trace where the image puts it.
func TestShippingDockerfile(t *testing.T) {
	im := shippingImageOf(t)
	if !slices.Contains(im.entrypoint, "--config.file=/etc/kvload/kvload.yml") {
		t.Errorf("ENTRYPOINT %q does not load /etc/kvload/kvload.yml", im.entrypoint)
	}
	cfg, ok := im.host("/etc/kvload/kvload.yml")
	if !ok {
		t.Fatalf("nothing is copied to /etc/kvload/kvload.yml")
	}
	if _, ok := im.host("/usr/share/kvload/traces/conversation_head1000.jsonl"); !ok {
		t.Errorf("the example traces are not under /usr/share/kvload/traces")
	}
	shippingCheckConfig(t, cfg, shippingRead(t, cfg), im.host)
}

func shippingImageOf(t *testing.T) shippingImage {
	t.Helper()
	instrs := shippingDockerfile(t)
	args := map[string]string{}
	type stage struct {
		from, name string
		instrs     []dockerInstr
	}
	var stages []*stage
	for _, in := range instrs {
		switch in.cmd {
		case "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			if len(stages) == 0 {
				args[k] = v
			}
		case "FROM":
			f := strings.Fields(in.args)
			s := &stage{from: os.Expand(f[0], func(k string) string { return args[k] })}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			stages = append(stages, s)
		}
		if len(stages) > 0 {
			stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, in)
		}
	}
	if len(stages) != 2 || stages[0].from != "golang:1.26" || stages[0].name != "builder" ||
		stages[1].from != "gcr.io/distroless/static-debian12:nonroot" {
		for _, s := range stages {
			t.Logf("stage %q from %q", s.name, s.from)
		}
		t.Fatalf("want two stages: golang:1.26 AS builder, then gcr.io/distroless/static-debian12:nonroot")
	}

	// The build: static, stamped, every package of the module copied.
	ignored := shippingDockerignore(t)
	var build string
	copied := map[string]bool{}
	for _, in := range stages[0].instrs {
		switch in.cmd {
		case "RUN":
			if strings.Contains(in.args, "go build") {
				build = in.args
			}
		case "COPY":
			f := strings.Fields(in.args)
			for _, src := range f[:len(f)-1] {
				shippingCheckCopySource(t, src, ignored)
				copied[strings.TrimSuffix(src, "/")] = true
			}
		}
	}
	if !strings.Contains(build, "CGO_ENABLED=0") || !strings.Contains(build, "./cmd/kvload-exporter") {
		t.Errorf("the build is not a static build of ./cmd/kvload-exporter: %s", build)
	}
	for _, v := range []string{"Version", "Revision", "Branch", "BuildDate", "BuildUser"} {
		if !strings.Contains(build, "-X github.com/prometheus/common/version."+v+"=${") {
			t.Errorf("the build does not set version.%s from a build argument: %s", v, build)
		}
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		if !copied[f] {
			t.Errorf("the builder does not copy %s", f)
		}
	}
	entries, err := os.ReadDir(shippingRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() || e.Name() == "tools" || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		// A directory of tests only (docs/) is no package the binary needs.
		gos, _ := filepath.Glob(filepath.Join(shippingRoot, e.Name(), "*.go"))
		gos = slices.DeleteFunc(gos, func(f string) bool { return strings.HasSuffix(f, "_test.go") })
		if len(gos) > 0 || e.Name() == "cmd" {
			if !copied[e.Name()] {
				t.Errorf("package directory %s/ is not copied into the builder", e.Name())
			}
		}
	}

	// The final image.
	im := shippingImage{files: map[string]string{}}
	var exposed, user string
	for _, in := range stages[1].instrs {
		switch in.cmd {
		case "COPY":
			f := strings.Fields(in.args)
			if strings.HasPrefix(f[0], "--from=") {
				if f[0] != "--from=builder" {
					t.Errorf("COPY %s: want --from=builder", in.args)
				}
				im.files[f[len(f)-1]] = "(built)"
				continue
			}
			if len(f) != 2 {
				t.Errorf("COPY %s: want one source", in.args)
				continue
			}
			shippingCheckCopySource(t, f[0], ignored)
			im.files[f[1]] = filepath.Join(shippingRoot, f[0])
		case "EXPOSE":
			exposed = in.args
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &im.entrypoint); err != nil {
				t.Errorf("ENTRYPOINT %s: want the exec (JSON) form: %v", in.args, err)
			}
		}
	}
	if exposed != strconv.Itoa(shippingPort) {
		t.Errorf("EXPOSE %q, want %d", exposed, shippingPort)
	}
	if !strings.HasPrefix(user, "nonroot") {
		t.Errorf("USER %q, want nonroot", user)
	}
	if len(im.entrypoint) == 0 || im.files[im.entrypoint[0]] != "(built)" {
		t.Errorf("ENTRYPOINT %q does not run the binary copied from the builder", im.entrypoint)
	}
	return im
}

// shippingDockerignore returns the .dockerignore patterns.
func shippingDockerignore(t *testing.T) []string {
	t.Helper()
	var pats []string
	for _, l := range strings.Split(string(shippingRead(t, filepath.Join(shippingRoot, ".dockerignore"))), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, "!") {
			t.Fatalf(".dockerignore: exceptions (%s) are not understood by this test", l)
		}
		pats = append(pats, strings.TrimPrefix(path.Clean(l), "/"))
	}
	for _, want := range []string{".git", ".cache", "bin", "dist"} {
		if !slices.Contains(pats, want) {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
	return pats
}

// shippingCheckCopySource requires a COPY source to exist and to be in the
// build context (no .dockerignore pattern matches it or a parent).
func shippingCheckCopySource(t *testing.T, src string, ignored []string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(shippingRoot, src)); err != nil {
		t.Errorf("COPY %s: %v", src, err)
	}
	p := path.Clean(src)
	for {
		for _, pat := range ignored {
			if m, _ := path.Match(strings.TrimPrefix(pat, "**/"), path.Base(p)); (strings.HasPrefix(pat, "**/") && m) || pat == p {
				t.Errorf("COPY %s: excluded from the build context by .dockerignore pattern %s", src, pat)
			}
			if m, _ := path.Match(pat, p); m {
				t.Errorf("COPY %s: excluded from the build context by .dockerignore pattern %s", src, pat)
			}
		}
		if !strings.Contains(p, "/") {
			return
		}
		p = path.Dir(p)
	}
}

// --- compose ------------------------------------------------------------

type composeFile struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	IPC         string            `yaml:"ipc"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   any               `yaml:"depends_on"`
	Deploy      struct {
		Resources struct {
			Reservations struct {
				Devices []struct {
					Driver       string   `yaml:"driver"`
					Count        any      `yaml:"count"`
					Capabilities []string `yaml:"capabilities"`
				} `yaml:"devices"`
			} `yaml:"reservations"`
		} `yaml:"resources"`
	} `yaml:"deploy"`
	Healthcheck any    `yaml:"healthcheck"`
	Restart     string `yaml:"restart"`
}

// host maps a path inside the service's container to the host through its
// bind mounts (relative to dir, the compose file's directory).
func (s composeService) host(dir, p string) (string, bool) {
	best, bestLen := "", -1
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		src, dst := parts[0], strings.TrimSuffix(parts[1], "/")
		if !strings.HasPrefix(src, ".") {
			continue
		}
		if (p == dst || strings.HasPrefix(p, dst+"/")) && len(dst) > bestLen {
			best, bestLen = filepath.Join(dir, src, strings.TrimPrefix(p, dst)), len(dst)
		}
	}
	return best, bestLen >= 0
}

// TestShippingCompose checks both compose stacks: services, bind mounts,
// the exporter's configuration (--config.check, trace in the image),
// Prometheus' scrape targets and rule files (= dashboards/rules), Grafana's
// data source and dashboards (= dashboards/*.json), ports and the GPU stack's
// vLLM flags.
func TestShippingCompose(t *testing.T) {
	im := shippingImageOf(t)
	for _, c := range []struct {
		file, exporterConfig, prometheusConfig string
		gpu                                    bool
	}{
		{"docker-compose.yml", "exporter/kvload.yml", "prometheus/prometheus.yml", false},
		{"docker-compose.gpu.yml", "exporter-gpu/kvload.yml", "prometheus/prometheus.gpu.yml", true},
	} {
		t.Run(c.file, func(t *testing.T) {
			var cf composeFile
			dec := yaml.NewDecoder(bytes.NewReader(shippingRead(t, filepath.Join(shippingCompose, c.file))))
			dec.KnownFields(true)
			if err := dec.Decode(&cf); err != nil {
				t.Fatalf("%s: %v", c.file, err)
			}
			want := []string{"grafana", "kvload-exporter", "prometheus"}
			if c.gpu {
				want = append(want, "vllm")
			}
			var names []string
			for n := range cf.Services {
				names = append(names, n)
			}
			sort.Strings(names)
			if !slices.Equal(names, want) {
				t.Fatalf("services %v, want %v", names, want)
			}
			ports := map[string]int{} // service → its port
			for name, s := range cf.Services {
				for _, v := range s.Volumes {
					parts := strings.Split(v, ":")
					if len(parts) < 2 {
						t.Errorf("%s: volume %q: want SRC:DST[:ro]", name, v)
						continue
					}
					if strings.HasPrefix(parts[0], ".") {
						if _, err := os.Stat(filepath.Join(shippingCompose, parts[0])); err != nil {
							t.Errorf("%s: volume %q: %v", name, v, err)
						}
						if len(parts) != 3 || parts[2] != "ro" {
							t.Errorf("%s: bind mount %q should be read-only", name, v)
						}
					} else if _, ok := cf.Volumes[parts[0]]; !ok {
						t.Errorf("%s: volume %q: %s is not declared under volumes:", name, v, parts[0])
					}
				}
				if s.Build != nil {
					df := filepath.Join(shippingCompose, s.Build.Context, s.Build.Dockerfile)
					if abs, _ := filepath.Abs(df); abs != shippingAbs(t, filepath.Join(shippingRoot, "Dockerfile")) {
						t.Errorf("%s: builds %s, not the repository's Dockerfile", name, df)
					}
				}
				for _, p := range s.Ports {
					hp, cp, _ := strings.Cut(p, ":")
					if hp != cp {
						t.Errorf("%s: port %q: publish on the same port", name, p)
					}
					n, err := strconv.Atoi(cp)
					if err != nil {
						t.Errorf("%s: port %q: %v", name, p, err)
					}
					ports[name] = n
				}
			}
			if ports["kvload-exporter"] != shippingPort || ports["prometheus"] != 9090 || ports["grafana"] != 3000 {
				t.Errorf("published ports %v: want kvload-exporter %d, prometheus 9090, grafana 3000", ports, shippingPort)
			}

			// The exporter: its configuration (the image's command line reads
			// /etc/kvload/kvload.yml), traces from the image.
			exp := cf.Services["kvload-exporter"]
			cfgPath, ok := exp.host(shippingCompose, "/etc/kvload/kvload.yml")
			if !ok || cfgPath != filepath.Join(shippingCompose, c.exporterConfig) {
				t.Errorf("/etc/kvload/kvload.yml is %q, want %s mounted", cfgPath, c.exporterConfig)
			} else {
				cfg := shippingCheckConfig(t, cfgPath, shippingRead(t, cfgPath), im.host)
				for _, tg := range cfg.Targets {
					if tg.Emulate != nil {
						continue
					}
					host, port := shippingHostPort(t, tg.URL)
					if _, ok := cf.Services[host]; !ok || !slices.Contains(cf.Services[host].Command, "--port="+port) {
						t.Errorf("target %s: %s is not a service of the stack listening on --port=%s", tg.Name, tg.URL, port)
					}
				}
			}
			for _, a := range exp.Command {
				if strings.HasPrefix(a, "--config.file") || strings.HasPrefix(a, "--web.listen-address") {
					t.Errorf("kvload-exporter: %s overrides the image's entrypoint", a)
				}
			}

			// Prometheus: scrape targets are services of the stack, rules are
			// dashboards/rules/*.yml.
			prom := cf.Services["prometheus"]
			if !slices.Contains(prom.Command, "--config.file=/etc/prometheus/prometheus.yml") {
				t.Errorf("prometheus: command %q", prom.Command)
			}
			pp, _ := prom.host(shippingCompose, "/etc/prometheus/prometheus.yml")
			if pp != filepath.Join(shippingCompose, c.prometheusConfig) {
				t.Errorf("prometheus.yml is %q, want %s", pp, c.prometheusConfig)
			}
			var pc struct {
				RuleFiles     []string `yaml:"rule_files"`
				ScrapeConfigs []struct {
					JobName       string `yaml:"job_name"`
					StaticConfigs []struct {
						Targets []string `yaml:"targets"`
					} `yaml:"static_configs"`
				} `yaml:"scrape_configs"`
			}
			shippingYAML(t, pp, &pc)
			var rules []string
			for _, rf := range pc.RuleFiles {
				h, ok := prom.host(shippingCompose, rf)
				if !ok {
					t.Errorf("rule_files %s is not mounted", rf)
					continue
				}
				m, _ := filepath.Glob(h)
				for _, f := range m {
					rules = append(rules, shippingAbs(t, f))
				}
			}
			wantRules, _ := filepath.Glob(filepath.Join(shippingRoot, "dashboards/rules/*.yml"))
			for i := range wantRules {
				wantRules[i] = shippingAbs(t, wantRules[i])
			}
			if len(wantRules) != 2 || !slices.Equal(rules, wantRules) {
				t.Errorf("Prometheus loads rules %v, want dashboards/rules/*.yml %v", rules, wantRules)
			}
			scraped := map[string]bool{}
			for _, sc := range pc.ScrapeConfigs {
				for _, st := range sc.StaticConfigs {
					for _, tg := range st.Targets {
						host, port, _ := strings.Cut(tg, ":")
						scraped[host] = true
						if _, ok := cf.Services[host]; !ok {
							t.Errorf("job %s: target %s is not a service of the stack", sc.JobName, tg)
						}
						if host == "kvload-exporter" && port != strconv.Itoa(shippingPort) {
							t.Errorf("job %s: the exporter is scraped on %s, it listens on %d", sc.JobName, tg, shippingPort)
						}
					}
				}
			}
			if !scraped["kvload-exporter"] || c.gpu && !scraped["vllm"] {
				t.Errorf("scraped %v: want the exporter (and vLLM in the GPU stack)", scraped)
			}

			// Grafana: the stack's Prometheus as data source, both dashboards.
			g := cf.Services["grafana"]
			dsDir, _ := g.host(shippingCompose, "/etc/grafana/provisioning/datasources")
			dsFiles, _ := filepath.Glob(filepath.Join(dsDir, "*.yml"))
			if len(dsFiles) != 1 {
				t.Fatalf("grafana: %d data source files in %s", len(dsFiles), dsDir)
			}
			var ds struct {
				Datasources []struct {
					Type, URL string
					IsDefault bool `yaml:"isDefault"`
				}
			}
			shippingYAML(t, dsFiles[0], &ds)
			if len(ds.Datasources) != 1 || ds.Datasources[0].Type != "prometheus" || ds.Datasources[0].URL != "http://prometheus:9090" || !ds.Datasources[0].IsDefault {
				t.Errorf("grafana data sources %+v: want the default one, Prometheus at http://prometheus:9090", ds.Datasources)
			}
			dbDir, _ := g.host(shippingCompose, "/etc/grafana/provisioning/dashboards")
			dbFiles, _ := filepath.Glob(filepath.Join(dbDir, "*.yml"))
			if len(dbFiles) != 1 {
				t.Fatalf("grafana: %d dashboard provider files in %s", len(dbFiles), dbDir)
			}
			var prov struct {
				Providers []struct {
					Type    string
					Options struct{ Path string }
				}
			}
			shippingYAML(t, dbFiles[0], &prov)
			if len(prov.Providers) != 1 || prov.Providers[0].Type != "file" {
				t.Fatalf("grafana dashboard providers %+v: want one of type file", prov.Providers)
			}
			dir, ok := g.host(shippingCompose, prov.Providers[0].Options.Path)
			if !ok {
				t.Fatalf("grafana: dashboards path %s is not mounted", prov.Providers[0].Options.Path)
			}
			for _, d := range shippingDashboards {
				if !bytes.Equal(shippingRead(t, filepath.Join(dir, d)), shippingRead(t, filepath.Join(shippingRoot, "dashboards", d))) {
					t.Errorf("grafana: %s is not dashboards/%s", filepath.Join(dir, d), d)
				}
			}

			if c.gpu {
				v := cf.Services["vllm"]
				for _, f := range []string{"--enable-prompt-tokens-details", "--enable-prefix-caching", "--port=8000"} {
					if !slices.Contains(v.Command, f) {
						t.Errorf("vllm: command %q lacks %s", v.Command, f)
					}
				}
				devs := v.Deploy.Resources.Reservations.Devices
				if len(devs) != 1 || devs[0].Driver != "nvidia" || !slices.Contains(devs[0].Capabilities, "gpu") {
					t.Errorf("vllm: GPU reservation %+v", devs)
				}
			}
		})
	}
}

// --- Kubernetes ---------------------------------------------------------

// k8sObject is the part of a manifest the test reads.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec yaml.Node         `yaml:"spec"`
	file string
}

type k8sStatefulSet struct {
	ServiceName string `yaml:"serviceName"`
	Replicas    int    `yaml:"replicas"`
	Selector    struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	Template struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec struct {
			Containers []struct {
				Name  string   `yaml:"name"`
				Image string   `yaml:"image"`
				Args  []string `yaml:"args"`
				Ports []struct {
					Name          string `yaml:"name"`
					ContainerPort int    `yaml:"containerPort"`
				} `yaml:"ports"`
				VolumeMounts []struct {
					Name      string `yaml:"name"`
					MountPath string `yaml:"mountPath"`
				} `yaml:"volumeMounts"`
			} `yaml:"containers"`
			Volumes []struct {
				Name      string `yaml:"name"`
				ConfigMap *struct {
					Name string `yaml:"name"`
				} `yaml:"configMap"`
			} `yaml:"volumes"`
		} `yaml:"spec"`
	} `yaml:"template"`
}

type k8sService struct {
	ClusterIP string            `yaml:"clusterIP"`
	Selector  map[string]string `yaml:"selector"`
	Ports     []struct {
		Name       string `yaml:"name"`
		Port       int    `yaml:"port"`
		TargetPort any    `yaml:"targetPort"`
	} `yaml:"ports"`
}

type k8sServiceMonitor struct {
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	Endpoints []struct {
		Port string `yaml:"port"`
		Path string `yaml:"path"`
	} `yaml:"endpoints"`
}

// TestShippingKubernetes checks examples/kubernetes: the exporter's
// configuration (--config.check, trace from the kvload-traces ConfigMap
// made of examples/traces), the StatefulSet's mounts, shards (--shard=auto
// with --shard.count = replicas) and port, the Service and ServiceMonitor
// selecting it, the PrometheusRule (= dashboards/rules) and the dashboard
// ConfigMaps (= dashboards/*.json).
func TestShippingKubernetes(t *testing.T) {
	if os.Getenv("KVLOAD_UPDATE_EXAMPLES") != "" {
		for name, body := range shippingGenerated(t) {
			if err := os.WriteFile(filepath.Join(shippingK8s, name), body, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, body := range shippingGenerated(t) {
		if !bytes.Equal(shippingRead(t, filepath.Join(shippingK8s, name)), body) {
			t.Errorf("examples/kubernetes/%s is not what dashboards/ gives: run KVLOAD_UPDATE_EXAMPLES=1 go test -run '^TestShippingKubernetes$' ./internal/shipping", name)
		}
	}

	files, err := filepath.Glob(filepath.Join(shippingK8s, "*.yml"))
	if err != nil {
		t.Fatal(err)
	}
	byKind := map[string][]k8sObject{}
	for _, f := range files {
		dec := yaml.NewDecoder(bytes.NewReader(shippingRead(t, f)))
		for {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.Kind == "" || o.APIVersion == "" || o.Metadata.Name == "" {
				t.Errorf("%s: a document without apiVersion, kind or metadata.name", f)
			}
			o.file = filepath.Base(f)
			byKind[o.Kind] = append(byKind[o.Kind], o)
		}
	}
	one := func(kind string, into any) k8sObject {
		t.Helper()
		if len(byKind[kind]) != 1 {
			t.Fatalf("%d %s objects, want 1", len(byKind[kind]), kind)
		}
		o := byKind[kind][0]
		if into != nil {
			if err := o.Spec.Decode(into); err != nil {
				t.Fatalf("%s %s: %v", kind, o.Metadata.Name, err)
			}
		}
		return o
	}

	var sts k8sStatefulSet
	stsObj := one("StatefulSet", &sts)
	var svc k8sService
	svcObj := one("Service", &svc)
	var sm k8sServiceMonitor
	one("ServiceMonitor", &sm)

	// The StatefulSet: one container, its ConfigMap mounts, its shards.
	if len(sts.Template.Spec.Containers) != 1 {
		t.Fatalf("StatefulSet: %d containers, want 1", len(sts.Template.Spec.Containers))
	}
	ctr := sts.Template.Spec.Containers[0]
	mounts := map[string]string{} // mount path → ConfigMap
	for _, m := range ctr.VolumeMounts {
		for _, v := range sts.Template.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				mounts[m.MountPath] = v.ConfigMap.Name
			}
		}
	}
	flags := map[string]string{}
	for _, a := range ctr.Args {
		k, v, _ := strings.Cut(a, "=")
		flags[k] = v
	}
	if flags["--shard"] != "auto" || flags["--shard.count"] != strconv.Itoa(sts.Replicas) || sts.Replicas < 2 {
		t.Errorf("StatefulSet: %d replicas, --shard=%s --shard.count=%s: want --shard=auto and --shard.count = replicas (≥ 2)",
			sts.Replicas, flags["--shard"], flags["--shard.count"])
	}
	for i := range sts.Replicas {
		pod := fmt.Sprintf("%s-%d", stsObj.Metadata.Name, i) // a StatefulSet pod's hostname
		s, err := cli.ParseShardFlag(flags["--shard"], sts.Replicas, pod)
		if err != nil || *s != (config.Shard{Index: i, Count: sts.Replicas}) {
			t.Errorf("pod %s: shard %+v, %v", pod, s, err)
		}
	}
	if addr := flags["--web.listen-address"]; addr != "" && addr != ":"+strconv.Itoa(shippingPort) {
		t.Errorf("StatefulSet: --web.listen-address=%s, want :%d", addr, shippingPort)
	}
	if len(ctr.Ports) != 1 || ctr.Ports[0].ContainerPort != shippingPort || ctr.Ports[0].Name != "metrics" {
		t.Errorf("StatefulSet: ports %+v, want metrics %d", ctr.Ports, shippingPort)
	}
	if !shippingSubset(sts.Selector.MatchLabels, sts.Template.Metadata.Labels) || len(sts.Selector.MatchLabels) == 0 {
		t.Errorf("StatefulSet: selector %v does not select its pods %v", sts.Selector.MatchLabels, sts.Template.Metadata.Labels)
	}

	// The configuration: where --config.file says, from the kvload-config
	// ConfigMap; traces from ConfigMaps made of examples/traces.
	cfgFile := flags["--config.file"]
	cmName := mounts[path.Dir(cfgFile)]
	var cfgData []byte
	for _, o := range byKind["ConfigMap"] {
		if o.Metadata.Name == cmName {
			cfgData = []byte(o.Data[path.Base(cfgFile)])
		}
	}
	if len(cfgData) == 0 {
		t.Fatalf("--config.file=%s: no ConfigMap mounted at %s holds %s (mounts %v)", cfgFile, path.Dir(cfgFile), path.Base(cfgFile), mounts)
	}
	header := string(shippingRead(t, filepath.Join(shippingK8s, "00-config.yml")))
	cfg := shippingCheckConfig(t, "ConfigMap "+cmName, cfgData, func(p string) (string, bool) {
		cm := mounts[path.Dir(p)]
		if cm == "" || cm == cmName {
			return "", false
		}
		// The trace ConfigMap is made with kubectl create configmap, as
		// 00-config.yml says.
		src := "examples/traces/" + path.Base(p)
		if !strings.Contains(header, "kubectl create configmap "+cm) || !strings.Contains(header, "--from-file="+src) {
			t.Errorf("00-config.yml does not say how to create ConfigMap %s from %s", cm, src)
		}
		return filepath.Join(shippingRoot, src), true
	})
	for _, tg := range cfg.Targets {
		if tg.Emulate != nil {
			t.Errorf("target %s is emulated: every replica would load its own engine, not share one", tg.Name)
		}
	}

	// The Service and the ServiceMonitor select the pods and the port.
	if svcObj.Metadata.Name != sts.ServiceName || svc.ClusterIP != "None" {
		t.Errorf("Service %s (clusterIP %q): want the StatefulSet's headless service %s", svcObj.Metadata.Name, svc.ClusterIP, sts.ServiceName)
	}
	if !shippingSubset(svc.Selector, sts.Template.Metadata.Labels) || len(svc.Selector) == 0 {
		t.Errorf("Service: selector %v does not select the pods %v", svc.Selector, sts.Template.Metadata.Labels)
	}
	if len(svc.Ports) != 1 || svc.Ports[0].Port != shippingPort || svc.Ports[0].Name != "metrics" || fmt.Sprint(svc.Ports[0].TargetPort) != "metrics" {
		t.Errorf("Service: ports %+v, want metrics %d → metrics", svc.Ports, shippingPort)
	}
	if !shippingSubset(sm.Selector.MatchLabels, svcObj.Metadata.Labels) || len(sm.Selector.MatchLabels) == 0 {
		t.Errorf("ServiceMonitor: selector %v does not select the Service %v", sm.Selector.MatchLabels, svcObj.Metadata.Labels)
	}
	if len(sm.Endpoints) != 1 || sm.Endpoints[0].Port != "metrics" || sm.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor: endpoints %+v, want port metrics, /metrics", sm.Endpoints)
	}

	// The PrometheusRule holds the groups of dashboards/rules/*.yml.
	var pr struct {
		Groups []any `yaml:"groups"`
	}
	one("PrometheusRule", &pr)
	var wantGroups []any
	ruleFiles, _ := filepath.Glob(filepath.Join(shippingRoot, "dashboards/rules/*.yml"))
	for _, f := range ruleFiles {
		var rf struct {
			Groups []any `yaml:"groups"`
		}
		shippingYAML(t, f, &rf)
		wantGroups = append(wantGroups, rf.Groups...)
	}
	if len(wantGroups) < 2 || !reflect.DeepEqual(pr.Groups, wantGroups) {
		t.Errorf("the PrometheusRule's groups are not those of dashboards/rules/*.yml (%d groups vs %d)", len(pr.Groups), len(wantGroups))
	}

	// Dashboard ConfigMaps for Grafana's sidecar hold dashboards/*.json.
	seen := map[string]bool{}
	for _, o := range byKind["ConfigMap"] {
		if o.Metadata.Labels["grafana_dashboard"] != "1" {
			continue
		}
		for k, v := range o.Data {
			seen[k] = true
			want, err := os.ReadFile(filepath.Join(shippingRoot, "dashboards", k))
			if err != nil || v != string(want) {
				t.Errorf("ConfigMap %s: %s is not dashboards/%s (%v)", o.Metadata.Name, k, k, err)
			}
		}
	}
	for _, d := range shippingDashboards {
		if !seen[d] {
			t.Errorf("no ConfigMap labelled grafana_dashboard: \"1\" holds %s", d)
		}
	}
}

// shippingGenerated renders the Kubernetes manifests generated from
// dashboards/: the PrometheusRule and the dashboard ConfigMaps.
func shippingGenerated(t *testing.T) map[string][]byte {
	t.Helper()
	indent := func(b *bytes.Buffer, text, prefix string) {
		for _, l := range strings.SplitAfter(text, "\n") {
			if strings.TrimSpace(l) != "" {
				b.WriteString(prefix)
			}
			b.WriteString(l)
		}
	}
	var rule bytes.Buffer
	rule.WriteString(`# Prometheus Operator: the recording and alerting rules of dashboards/rules/,
# generated from them (see internal/shipping/shipping_test.go). The release
# label is what kube-prometheus-stack's Prometheus selects by default.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: kvload
  labels:
    app.kubernetes.io/name: kvload-exporter
    release: kube-prometheus-stack
spec:
  groups:
`)
	ruleFiles, _ := filepath.Glob(filepath.Join(shippingRoot, "dashboards/rules/*.yml"))
	for _, f := range ruleFiles {
		src := string(shippingRead(t, f))
		i := strings.Index(src, "\ngroups:\n")
		if i < 0 {
			t.Fatalf("%s: no top-level groups:", f)
		}
		fmt.Fprintf(&rule, "    # dashboards/rules/%s\n", filepath.Base(f))
		indent(&rule, src[i+len("\ngroups:\n"):], "  ")
	}
	var dash bytes.Buffer
	dash.WriteString(`# The Grafana dashboards of dashboards/, for Grafana's dashboard sidecar
# (kube-prometheus-stack, the Grafana Helm chart: ConfigMaps labelled
# grafana_dashboard: "1"), generated from them (see
# internal/shipping/shipping_test.go). Both dashboards sum over the
# exporter's replicas (by workload and target), so a sharded StatefulSet
# shows as one load generator.
`)
	for i, d := range shippingDashboards {
		if i > 0 {
			dash.WriteString("---\n")
		}
		fmt.Fprintf(&dash, `apiVersion: v1
kind: ConfigMap
metadata:
  name: kvload-dashboard-%s
  labels:
    app.kubernetes.io/name: kvload-exporter
    grafana_dashboard: "1"
  annotations:
    grafana_folder: kvload
data:
  %s: |
`, strings.TrimSuffix(strings.TrimPrefix(d, "kvload-"), ".json"), d)
		indent(&dash, string(shippingRead(t, filepath.Join(shippingRoot, "dashboards", d))), "    ")
	}
	return map[string][]byte{"40-prometheusrule.yml": rule.Bytes(), "50-grafana-dashboards.yml": dash.Bytes()}
}

// --- helpers ------------------------------------------------------------

// shippingCheckConfig runs --config.check on an exporter configuration as
// it will be deployed. Every trace is at an absolute path, which host maps
// to the repository; the check runs on a copy in a temporary directory,
// with each trace next to it. It returns the parsed configuration.
func shippingCheckConfig(t *testing.T, name string, data []byte, host func(string) (string, bool)) *config.Config {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	dir := t.TempDir()
	workloads, _ := doc["workloads"].([]any)
	if len(workloads) == 0 {
		t.Fatalf("%s: no workloads", name)
	}
	for _, w := range workloads {
		w := w.(map[string]any)
		trace, _ := w["trace"].(string)
		src, ok := host(trace)
		if !path.IsAbs(trace) || !ok {
			t.Errorf("%s: workload %v: trace %q is not where the deployment puts a trace", name, w["name"], trace)
			continue
		}
		base := fmt.Sprintf("trace-%v.jsonl", w["name"])
		if err := os.WriteFile(filepath.Join(dir, base), shippingRead(t, src), 0o644); err != nil {
			t.Fatal(err)
		}
		w["trace"] = base
	}
	edited, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "kvload.yml")
	if err := os.WriteFile(file, edited, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := cli.Run(context.Background(), []string{"--config.file", file, "--config.check"}, &stdout, &stderr); code != cli.ExitOK {
		t.Fatalf("%s: --config.check: exit code %d\n%s%s", name, code, stdout.String(), stderr.String())
	}
	cfg, err := config.ParseFile(file, edited)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func shippingRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// shippingYAML decodes a single-document YAML file, rejecting unknown keys.
func shippingYAML(t *testing.T, p string, into any) {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(shippingRead(t, p)))
	if err := dec.Decode(into); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
}

// shippingYAMLDocs decodes every document of a YAML file.
func shippingYAMLDocs(t *testing.T, p string) []any {
	t.Helper()
	var docs []any
	dec := yaml.NewDecoder(bytes.NewReader(shippingRead(t, p)))
	for {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Errorf("%s: document %d: %v", p, len(docs)+1, err)
			break
		}
		docs = append(docs, v)
	}
	if len(docs) == 0 {
		t.Errorf("%s: no YAML document", p)
	}
	return docs
}

func shippingAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func shippingHostPort(t *testing.T, u string) (string, string) {
	t.Helper()
	hp := strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://")
	host, port, err := net.SplitHostPort(strings.TrimSuffix(hp, "/"))
	if err != nil {
		t.Errorf("target URL %s: %v", u, err)
	}
	return host, port
}

func shippingSubset(sub, of map[string]string) bool {
	for k, v := range sub {
		if of[k] != v {
			return false
		}
	}
	return true
}

// TestExamplePrompts: examples/prompts.jsonl, the README's sample for
// hash, hashes into a trace whose rows share the prefixes they share as
// text: the support conversations their system prompt, the follow-up its
// first turn.
func TestExamplePrompts(t *testing.T) {
	out := filepath.Join(t.TempDir(), "trace.jsonl")
	var stderr bytes.Buffer
	args := []string{"hash", filepath.Join(shippingRoot, "examples", "prompts.jsonl"), "-o", out, "--block-size", "16"}
	if code := cli.Run(context.Background(), args, &stderr, &stderr); code != cli.ExitOK {
		t.Fatalf("hash exited %d: %s", code, stderr.String())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rows [][]int64
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r struct {
			HashIDs []int64 `json:"hash_ids"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r.HashIDs)
	}
	if len(rows) != 5 {
		t.Fatalf("%d rows, want 5", len(rows))
	}
	shared := func(a, b []int64) int {
		n := 0
		for n < len(a) && n < len(b) && a[n] == b[n] {
			n++
		}
		return n
	}
	if n := shared(rows[0], rows[1]); n < 3 {
		t.Errorf("support rows share %d blocks, want their system prompt's", n)
	}
	if n := shared(rows[0], rows[2]); n <= shared(rows[0], rows[1]) || n == len(rows[0]) {
		t.Errorf("the follow-up shares %d blocks with its first turn (%d)", n, len(rows[0]))
	}
	if shared(rows[3], rows[4]) < 1 || slices.Contains(rows[3], rows[0][0]) {
		t.Errorf("summaries %v %v should share their start and nothing with the support rows", rows[3], rows[4])
	}
}

// TestMakeStampsVersion: make run and make build link the version in, so
// the landing page's footer and --version name the commit.
func TestMakeStampsVersion(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	for _, target := range []string{"build", "run"} {
		cmd := exec.Command("make", "-n", target)
		cmd.Dir = filepath.Join("..", "..")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make -n %s: %v\n%s", target, err, out)
		}
		if !strings.Contains(string(out), "-X github.com/prometheus/common/version.Version=") ||
			!strings.Contains(string(out), "version.Revision=") {
			t.Errorf("make %s does not stamp the version:\n%s", target, out)
		}
	}
}
