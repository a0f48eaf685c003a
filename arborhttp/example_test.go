package arborhttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/arborhq/arbor/arborhttp"
	"github.com/arborhq/arbor/arbortype"
)

// A handler answers an arbor error with its status and short message, and
// logs the error itself.
func ExampleStatus() {
	fail := func(w http.ResponseWriter, err error) {
		status, msg := arborhttp.Status(err)
		http.Error(w, msg, status)
	}
	w := httptest.NewRecorder()
	fail(w, fmt.Errorf("create task: %w", arbortype.ErrBusy)) // a turn created with the reject policy
	fmt.Print(w.Code, " ", w.Body.String())
	// Output:
	// 409 a turn of the conversation is live
}
