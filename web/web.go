// Package web holds tailgate's embedded dashboard and the handler that serves
// it under /ui/: plain ES modules, CSS and hand-drawn SVG charts, no build
// step. The page reads and drives the admin API with the admin token from
// its #token= fragment or pasted in; it imports nothing of the project.
package web

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed assets
var assets embed.FS

// Handler serves the dashboard's files under /ui/.
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return http.StripPrefix("/ui/", http.FileServerFS(sub))
}
