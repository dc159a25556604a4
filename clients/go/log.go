package analytics

import (
	"log"
	"os"
	"strings"
)

func newDefaultLogger() *log.Logger {
	return log.New(os.Stderr, "analytics ", log.LstdFlags)
}

// debugEnv reports whether DEBUG selects this library. Like the Node debug
// module it is a comma- or space-separated list: "analytics", "analytics*",
// "analytics:*" or "*" turn logging on.
func debugEnv(v string) bool {
	for _, f := range strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' }) {
		switch f {
		case "analytics", "analytics*", "analytics:*", "*":
			return true
		}
	}
	return false
}

// debugf logs only with Verbose or DEBUG=analytics.
func (c *Client) debugf(format string, args ...interface{}) {
	if c.cfg.verbose {
		c.cfg.logger.Printf("debug: "+format, args...)
	}
}

// errorf always logs: drops and failures must never be silent.
func (c *Client) errorf(format string, args ...interface{}) {
	c.cfg.logger.Printf("error: "+format, args...)
}
