package policy

import (
	"fmt"
	"strings"
)

// Class is a request's priority class. Under load the gateway admits
// requests in class order: interactive first, then standard, then batch. A
// key's class is the highest its requests may ask for (a request may lower
// its own class, never raise it). The zero Class is standard.
type Class uint8

// The priority classes, highest first in admission order except that the
// zero value is the default, standard.
const (
	ClassStandard Class = iota
	ClassInteractive
	ClassBatch
	numClasses
)

// Classes lists the classes in admission order, highest first.
var Classes = [numClasses]Class{ClassInteractive, ClassStandard, ClassBatch}

// rank is a class's place in admission order: 0 goes first.
func (c Class) rank() int {
	switch c {
	case ClassInteractive:
		return 0
	case ClassBatch:
		return 2
	}
	return 1
}

func (c Class) String() string {
	switch c {
	case ClassInteractive:
		return "interactive"
	case ClassBatch:
		return "batch"
	}
	return "standard"
}

// ParseClass reads a class by its name; "" is standard.
func ParseClass(s string) (Class, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "interactive":
		return ClassInteractive, nil
	case "standard", "":
		return ClassStandard, nil
	case "batch":
		return ClassBatch, nil
	}
	return 0, fmt.Errorf("priority class %q: want interactive, standard or batch", s)
}

// Cap returns the class a request of a key of class c runs as when it asks
// for want: want if it is not above c, else c. A key's class is a ceiling.
func (c Class) Cap(want Class) Class {
	if want.rank() < c.rank() {
		return c
	}
	return want
}

// StoredClass reads a key's stored class (data.Key.Class). A name this version does not
// know (written by a newer one) is standard rather than an error, so the
// key keeps working.
func StoredClass(s string) Class {
	c, err := ParseClass(s)
	if err != nil {
		return ClassStandard
	}
	return c
}
