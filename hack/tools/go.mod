// The Go tools the project builds from the Go module proxy, at the versions it builds
// them: hack/actionlint, hack/h2spec and e2e/kind read their version from here (through
// hack/tool-version), and Dependabot (gomod, this directory) proposes new ones. Nothing
// is built in this module itself.
module kubegrace.invalid/tools

go 1.25.0

tool (
	github.com/rhysd/actionlint/cmd/actionlint
	github.com/summerwind/h2spec/cmd/h2spec
	sigs.k8s.io/kind
)

require (
	al.essio.dev/pkg/shellescape v1.5.1 // indirect
	github.com/BurntSushi/toml v1.4.0 // indirect
	github.com/bmatcuk/doublestar/v4 v4.10.0 // indirect
	github.com/clipperhouse/uax29/v2 v2.7.0 // indirect
	github.com/evanphx/json-patch/v5 v5.6.0 // indirect
	github.com/fatih/color v1.19.0 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/mattn/go-runewidth v0.0.21 // indirect
	github.com/mattn/go-shellwords v1.0.12 // indirect
	github.com/pelletier/go-toml v1.9.5 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/rhysd/actionlint v1.7.12 // indirect
	github.com/robfig/cron/v3 v3.0.1 // indirect
	github.com/spf13/cobra v1.8.0 // indirect
	github.com/spf13/pflag v1.0.5 // indirect
	github.com/summerwind/h2spec v2.2.1+incompatible // indirect
	go.yaml.in/yaml/v3 v3.0.4 // indirect
	go.yaml.in/yaml/v4 v4.0.0-rc.3 // indirect
	golang.org/x/net v0.52.0 // indirect
	golang.org/x/sync v0.20.0 // indirect
	golang.org/x/sys v0.42.0 // indirect
	golang.org/x/text v0.35.0 // indirect
	sigs.k8s.io/kind v0.30.0 // indirect
	sigs.k8s.io/yaml v1.4.0 // indirect
)
