package machine

import (
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/arborhq/arbor/arbortype"
)

// Every field of SpawnParams is a field of arbortype.CreateParams of the same
// type, and SpawnParams.create carries it: a field added to SpawnParams and
// not to the conversion fails here.
func TestSpawnParamsCarried(t *testing.T) {
	t.Parallel()
	var p SpawnParams
	v := reflect.ValueOf(&p).Elem()
	for i := range v.NumField() {
		setNonZero(t, v.Type().Field(i).Name, v.Field(i))
	}
	got := reflect.ValueOf(p.create("conv", 7))
	for i := range v.NumField() {
		f := v.Type().Field(i)
		cf, ok := got.Type().FieldByName(f.Name)
		require.True(t, ok, "SpawnParams.%s has no field of arbortype.CreateParams", f.Name)
		require.Equal(t, f.Type, cf.Type, "SpawnParams.%s", f.Name)
		require.Equal(t, v.Field(i).Interface(), got.FieldByIndex(cf.Index).Interface(),
			"SpawnParams.%s is not carried into the create", f.Name)
	}
	c := p.create("conv", 7)
	require.Equal(t, "conv", c.ConversationID)
	require.EqualValues(t, 7, c.OwnerID)
}

// setNonZero gives v, a field of a params struct, a value that is not its
// zero value.
func setNonZero(t *testing.T, name string, v reflect.Value) {
	t.Helper()
	switch {
	case v.Kind() == reflect.String:
		v.SetString(name)
	case v.Kind() == reflect.Bool:
		v.SetBool(true)
	case v.Kind() == reflect.Int || v.Kind() == reflect.Int64: // time.Duration too
		v.SetInt(int64(len(name)) + 3)
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8: // json.RawMessage
		v.SetBytes([]byte(`"` + name + `"`))
	case v.Type() == reflect.TypeFor[[]arbortype.BudgetLimit]():
		v.Set(reflect.ValueOf([]arbortype.BudgetLimit{{Counter: name, Max: 5}}))
	case v.Type() == reflect.TypeFor[time.Time]():
		v.Set(reflect.ValueOf(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)))
	default:
		t.Fatalf("field %s: no test value for %s; add one here", name, v.Type())
	}
}
