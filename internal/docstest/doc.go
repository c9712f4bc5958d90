// Package docstest holds the tests of the documentation: every Caddyfile of
// the README, docs/ and examples/ adapts (and the complete ones provision),
// every CLI example's command and flags exist, the generated output the docs
// show is what the commands print.
package docstest
