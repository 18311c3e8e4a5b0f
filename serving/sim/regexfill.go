package sim

import (
	"fmt"
	"regexp"
	"regexp/syntax"
	"unicode"
)

// regexFill returns a short string the regular expression matches as a
// whole, the simulator's stand-in for vLLM's regex-guided decoding
// (structured_outputs.regex, guided_regex, a schema string's pattern). It
// is best effort: the pattern is read with Go's RE2 syntax, which has
// Python's common features but not lookaround or backreferences (those are
// refused); the string takes the first branch of every alternation, the
// fewest repetitions allowed, and from a character class a letter or digit
// where it has one. The result is checked against the pattern; a string
// that does not match (word boundaries, say) is an error.
func regexFill(pattern string, x uint32) (string, error) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return "", fmt.Errorf("the simulated engine cannot read regex %q (RE2 syntax: no lookaround or backreferences): %w", pattern, err)
	}
	var out []rune
	out = fillRegexp(out, re.Simplify(), x)
	s := string(out)
	full, err := regexp.Compile(`^(?:` + pattern + `)$`)
	if err != nil || !full.MatchString(s) {
		return "", fmt.Errorf("the simulated engine found no string for regex %q", pattern)
	}
	return s, nil
}

func fillRegexp(out []rune, re *syntax.Regexp, x uint32) []rune {
	switch re.Op {
	case syntax.OpLiteral:
		if re.Flags&syntax.FoldCase != 0 {
			for _, r := range re.Rune {
				out = append(out, unicode.ToLower(r))
			}
			return out
		}
		return append(out, re.Rune...)
	case syntax.OpCharClass:
		return append(out, classRune(re.Rune, x))
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return append(out, 'a')
	case syntax.OpCapture:
		return fillRegexp(out, re.Sub[0], x)
	case syntax.OpConcat:
		for i, sub := range re.Sub {
			out = fillRegexp(out, sub, seed(x, i))
		}
		return out
	case syntax.OpAlternate:
		return fillRegexp(out, re.Sub[0], x)
	case syntax.OpPlus:
		return fillRegexp(out, re.Sub[0], x)
	case syntax.OpRepeat:
		for i := range re.Min {
			out = fillRegexp(out, re.Sub[0], seed(x, i))
		}
		return out
	}
	// OpStar, OpQuest, anchors, boundaries, empty matches: nothing.
	return out
}

// classRune picks a rune of a character class (pairs of inclusive ranges):
// a lowercase letter, else a letter or digit, else the first rune.
func classRune(ranges []rune, x uint32) rune {
	if len(ranges) == 0 {
		return 'a'
	}
	for _, want := range []func(rune) bool{unicode.IsLower, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }} {
		for i := 0; i+1 < len(ranges); i += 2 {
			lo, hi := ranges[i], min(ranges[i+1], ranges[i]+255)
			span := uint32(hi - lo + 1)
			for k := range span {
				r := lo + rune((x+k)%span)
				if want(r) {
					return r
				}
			}
		}
	}
	return ranges[0]
}
