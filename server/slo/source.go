package slo

import (
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"
)

// SourceHeader is the request header that names a request's source.
const SourceHeader = "X-Tailgate-Source"

// Source labels every request gets when it names none, or one that is not
// configured.
const (
	SourceDefault = "default"
	SourceOther   = "other"
)

// MaxSources bounds the configured source labels, so the evaluation's series
// (and the metrics' label values) stay few.
const MaxSources = 16

// SourceConfig labels requests by where they come from. A request's label
// is its SourceHeader when that names a configured label (any other value
// folds into "other"), else the label of the first CIDR holding the client's
// address, else "default".
type SourceConfig struct {
	// Labels are the labels the header may name; CIDR labels are added.
	Labels []string `yaml:"labels"`
	// CIDRs maps a client network to its label, e.g. 10.1.0.0/16: eu.
	CIDRs map[string]string `yaml:"cidrs"`
}

var labelRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,31}$`)

// Validate checks the labels and networks and bounds their number.
func (c *SourceConfig) Validate() error {
	_, err := c.compile()
	return err
}

type cidrLabel struct {
	net   netip.Prefix
	label string
}

// Sources is a compiled SourceConfig; its zero value labels every request
// "default".
type Sources struct {
	labels []string
	cidrs  []cidrLabel // longest prefix first
}

// NewSources compiles c.
func NewSources(c SourceConfig) (*Sources, error) { return c.compile() }

func (c *SourceConfig) compile() (*Sources, error) {
	s := &Sources{}
	add := func(l, where string) error {
		if !labelRE.MatchString(l) || l == SourceDefault || l == SourceOther {
			return fmt.Errorf("sources%s %q: want a short lowercase label (a-z, 0-9, _ . -), not %q or %q", where, l, SourceDefault, SourceOther)
		}
		if !slices.Contains(s.labels, l) {
			s.labels = append(s.labels, l)
		}
		return nil
	}
	for _, l := range c.Labels {
		if err := add(l, ".labels"); err != nil {
			return nil, err
		}
	}
	for _, cidr := range slices.Sorted(maps.Keys(c.CIDRs)) {
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			return nil, fmt.Errorf("sources.cidrs %q: want a network such as 10.1.0.0/16 or fd00::/8", cidr)
		}
		if err := add(c.CIDRs[cidr], ".cidrs."+cidr); err != nil {
			return nil, err
		}
		s.cidrs = append(s.cidrs, cidrLabel{p.Masked(), c.CIDRs[cidr]})
	}
	if len(s.labels) > MaxSources {
		return nil, fmt.Errorf("sources: %d labels, at most %d (each one is a series per model and stage)", len(s.labels), MaxSources)
	}
	slices.SortStableFunc(s.cidrs, func(a, b cidrLabel) int { return b.net.Bits() - a.net.Bits() })
	return s, nil
}

// Label returns the source label of a request with header value h (""
// when absent) from the client address remote ("ip:port" or "ip").
func (s *Sources) Label(h, remote string) string {
	if h != "" {
		h = strings.ToLower(strings.TrimSpace(h))
		if slices.Contains(s.labels, h) {
			return h
		}
		return SourceOther
	}
	if len(s.cidrs) == 0 {
		return SourceDefault
	}
	ap, err := netip.ParseAddrPort(remote)
	addr := ap.Addr()
	if err != nil {
		if addr, err = netip.ParseAddr(remote); err != nil {
			return SourceDefault
		}
	}
	addr = addr.Unmap()
	for _, c := range s.cidrs {
		if c.net.Contains(addr) {
			return c.label
		}
	}
	return SourceDefault
}

// Count is the number of labels a request can get: the configured ones,
// "default" and "other".
func (s *Sources) Count() int { return len(s.labels) + 2 }
