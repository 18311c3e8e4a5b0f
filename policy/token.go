package policy

import (
	"fmt"
	"regexp"
	"strings"
)

// MinTokenBytes is the least randomness, in bytes, an admin or cluster
// token must carry: whoever guesses one owns the gateway or its workers.
const MinTokenBytes = 32

// MakeToken says how to make a token that passes [CheckToken].
const MakeToken = "make one with: openssl rand -hex 32   (or: head -c 32 /dev/urandom | base64)"

// legacyToken is a token an earlier gateway made itself (24 random bytes
// in hex): still accepted, so an upgrade does not lock its workers out.
var legacyToken = regexp.MustCompile(`^tg[ac]-[0-9a-f]{48}$`)

// CheckToken refuses an admin or cluster token that carries fewer than
// MinTokenBytes random bytes, judged by its length in its alphabet: 4 bits
// a character for hex, at most 6 for anything else (base64 and the like).
// what names where the token came from, for the error.
func CheckToken(tok, what string) error {
	if legacyToken.MatchString(tok) {
		return nil
	}
	body := strings.TrimPrefix(strings.TrimPrefix(tok, "tga-"), "tgc-")
	body = strings.TrimRight(body, "=")
	bits := 6 * len(body)
	if isHex(body) {
		bits = 4 * len(body)
	}
	if bits < 8*MinTokenBytes {
		return fmt.Errorf("%s is too short to be safe (%d characters; want %d random bytes: 64 hex or 43 base64 characters); %s",
			what, len(tok), MinTokenBytes, MakeToken)
	}
	return nil
}

func isHex(s string) bool {
	for i := range len(s) {
		switch c := s[i]; {
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f', 'A' <= c && c <= 'F':
		default:
			return false
		}
	}
	return true
}
