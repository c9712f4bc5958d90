package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// RepoRoot returns the directory of the repository's go.mod, found by
// walking up from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("e2e: no go.mod above the working directory")
		}
		dir = parent
	}
}

// BuildCaddy builds the repository's custom Caddy (go build ./xcaddy) into
// dir and returns the binary's path.
func BuildCaddy(ctx context.Context, dir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "caddy")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./xcaddy")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("e2e: go build ./xcaddy: %w\n%s", err, out)
	}
	return bin, nil
}
