package data

import (
	"errors"
	"fmt"
	"strings"

	"modernc.org/sqlite"
)

// sqliteCode names SQLite's result code in err ("SQLITE_FULL",
// "SQLITE_IOERR_WRITE"), or returns "" if err is not SQLite's.
func sqliteCode(err error) string {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return ""
	}
	for _, c := range []int{se.Code(), se.Code() & 0xff} {
		s := sqlite.ErrorCodeString[c]
		if i := strings.LastIndexByte(s, '('); i >= 0 && strings.HasSuffix(s, ")") {
			return s[i+1 : len(s)-1]
		}
	}
	return fmt.Sprintf("SQLite error %d", se.Code())
}

// dbCode names the database's error code in err: SQLite's result code or
// PostgreSQL's SQLSTATE; "" if err carries neither.
func dbCode(err error) string {
	if c := sqliteCode(err); c != "" {
		return c
	}
	return pgCode(err)
}

// isUniqueViolation reports whether err is a unique constraint refusing a
// row, on either engine.
func isUniqueViolation(err error) bool {
	const sqliteConstraintUnique = 2067 // SQLITE_CONSTRAINT_UNIQUE, missing from ErrorCodeString
	if se, ok := errors.AsType[*sqlite.Error](err); ok {
		return se.Code() == sqliteConstraintUnique
	}
	return pgCode(err) == "SQLSTATE 23505"
}
