package qdranttest

import (
	"math"

	"github.com/qdrant/go-client/qdrant"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// checkFilter rejects a filter the server cannot evaluate, before any point
// is looked at, so an unsupported filter fails even on an empty collection.
func checkFilter(f *qdrant.Filter) error {
	if f == nil {
		return nil
	}
	for _, group := range [][]*qdrant.Condition{f.GetMust(), f.GetShould(), f.GetMustNot(), f.GetMinShould().GetConditions()} {
		for _, c := range group {
			if err := checkCondition(c); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkCondition(c *qdrant.Condition) error {
	switch v := c.GetConditionOneOf().(type) {
	case *qdrant.Condition_Field:
		return checkField(v.Field)
	case *qdrant.Condition_HasId:
		for _, id := range v.HasId.GetHasId() {
			if _, err := parsePointID(id); err != nil {
				return err
			}
		}
		return nil
	case *qdrant.Condition_Filter:
		return checkFilter(v.Filter)
	case *qdrant.Condition_IsEmpty:
		return checkKey(v.IsEmpty.GetKey())
	case *qdrant.Condition_IsNull:
		return checkKey(v.IsNull.GetKey())
	case *qdrant.Condition_Nested:
		return unsupported("the nested condition")
	case *qdrant.Condition_HasVector:
		return unsupported("the has_vector condition")
	default:
		return badInput("Validation error in body: [filter: condition is required]")
	}
}

func checkKey(key string) error {
	if key == "" {
		return status.Error(codes.InvalidArgument, "Invalid json path: ''")
	}
	return nil
}

func checkField(f *qdrant.FieldCondition) error {
	if err := checkKey(f.GetKey()); err != nil {
		return err
	}
	switch {
	case f.GeoBoundingBox != nil || f.GeoRadius != nil || f.GeoPolygon != nil:
		return unsupported("a geo condition")
	case f.DatetimeRange != nil:
		return unsupported("a datetime range")
	case f.ValuesCount != nil:
		return unsupported("a values_count condition")
	case f.IsEmpty != nil || f.IsNull != nil:
		return unsupported("is_empty or is_null inside a field condition")
	case f.Match == nil && f.Range == nil:
		return badInput("At least one field condition must be specified")
	}
	if f.Match != nil {
		switch f.Match.GetMatchValue().(type) {
		case *qdrant.Match_Keyword, *qdrant.Match_Integer, *qdrant.Match_Boolean,
			*qdrant.Match_Keywords, *qdrant.Match_Integers:
		case nil:
			return status.Error(codes.InvalidArgument, "Malformed Match condition")
		default:
			return unsupported("this match kind (text, phrase, except)")
		}
	}
	return nil
}

// matches evaluates a checked filter on a point of c: every must, at least
// one should (when there are any), no must_not, and min_should.
func (c *collection) matches(f *qdrant.Filter, p *point) bool {
	if f == nil {
		return true
	}
	for _, cond := range f.GetMust() {
		if !c.holds(cond, p) {
			return false
		}
	}
	for _, cond := range f.GetMustNot() {
		if c.holds(cond, p) {
			return false
		}
	}
	if should := f.GetShould(); len(should) > 0 {
		found := false
		for _, cond := range should {
			if c.holds(cond, p) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	if ms := f.GetMinShould(); ms != nil {
		n := uint64(0)
		for _, cond := range ms.GetConditions() {
			if c.holds(cond, p) {
				n++
			}
		}
		if n < ms.GetMinCount() {
			return false
		}
	}
	return true
}

func (c *collection) holds(cond *qdrant.Condition, p *point) bool {
	switch v := cond.GetConditionOneOf().(type) {
	case *qdrant.Condition_Field:
		key := v.Field.GetKey()
		return fieldHolds(v.Field, p.payload[key], c.indexes[key])
	case *qdrant.Condition_HasId:
		for _, id := range v.HasId.GetHasId() {
			if pid, err := parsePointID(id); err == nil && pid == p.id {
				return true
			}
		}
		return false
	case *qdrant.Condition_Filter:
		return c.matches(v.Filter, p)
	case *qdrant.Condition_IsEmpty:
		val, ok := p.payload[v.IsEmpty.GetKey()]
		return !ok || isNull(val) || (val.GetListValue() != nil && len(val.GetListValue().GetValues()) == 0)
	case *qdrant.Condition_IsNull:
		val, ok := p.payload[v.IsNull.GetKey()]
		return ok && isNull(val)
	}
	return false
}

func isNull(v *qdrant.Value) bool {
	_, ok := v.GetKind().(*qdrant.Value_NullValue)
	return ok
}

// fieldHolds evaluates a field condition on a payload value; on an array
// it holds when it holds for any element, as in Qdrant. index is the
// field's payload index, if any: a range on a field with an integer index
// is decided by the index, as in Qdrant (see intRangeHolds).
func fieldHolds(f *qdrant.FieldCondition, v *qdrant.Value, index qdrant.PayloadSchemaType) bool {
	if v == nil {
		return false
	}
	values := []*qdrant.Value{v}
	if list := v.GetListValue(); list != nil {
		values = list.GetValues()
	}
	if f.Match != nil && !anyValue(values, func(x *qdrant.Value) bool { return matchHolds(f.Match, x) }) {
		return false
	}
	inRange := rangeHolds
	if index == qdrant.PayloadSchemaType_Integer {
		inRange = intRangeHolds
	}
	if f.Range != nil && !anyValue(values, func(x *qdrant.Value) bool { return inRange(f.Range, x) }) {
		return false
	}
	return true
}

func anyValue(values []*qdrant.Value, fn func(*qdrant.Value) bool) bool {
	for _, v := range values {
		if fn(v) {
			return true
		}
	}
	return false
}

func matchHolds(m *qdrant.Match, v *qdrant.Value) bool {
	switch mv := m.GetMatchValue().(type) {
	case *qdrant.Match_Keyword:
		s, ok := v.GetKind().(*qdrant.Value_StringValue)
		return ok && s.StringValue == mv.Keyword
	case *qdrant.Match_Integer:
		i, ok := v.GetKind().(*qdrant.Value_IntegerValue)
		return ok && i.IntegerValue == mv.Integer
	case *qdrant.Match_Boolean:
		b, ok := v.GetKind().(*qdrant.Value_BoolValue)
		return ok && b.BoolValue == mv.Boolean
	case *qdrant.Match_Keywords:
		s, ok := v.GetKind().(*qdrant.Value_StringValue)
		if !ok {
			return false
		}
		for _, k := range mv.Keywords.GetStrings() {
			if k == s.StringValue {
				return true
			}
		}
	case *qdrant.Match_Integers:
		i, ok := v.GetKind().(*qdrant.Value_IntegerValue)
		if !ok {
			return false
		}
		for _, k := range mv.Integers.GetIntegers() {
			if k == i.IntegerValue {
				return true
			}
		}
	}
	return false
}

func rangeHolds(r *qdrant.Range, v *qdrant.Value) bool {
	var x float64
	switch n := v.GetKind().(type) {
	case *qdrant.Value_IntegerValue:
		x = float64(n.IntegerValue)
	case *qdrant.Value_DoubleValue:
		x = n.DoubleValue
	default:
		return false
	}
	return (r.Lt == nil || x < r.GetLt()) &&
		(r.Gt == nil || x > r.GetGt()) &&
		(r.Lte == nil || x <= r.GetLte()) &&
		(r.Gte == nil || x >= r.GetGte())
}

// intRangeHolds is a range on a field with an integer index, which Qdrant
// checks against the index (get_float_range_checkers in
// lib/segment/src/index/query_optimization/condition_converter.rs): the
// bounds are cast to integers as Rust's "as i64" does (toward zero,
// saturating), so "lt 2.5" is "lt 2" and excludes 2, and integers compare
// exactly, above 2^53 too; a value that is no integer is not in the index
// and matches no range. Without the index the range compares floats
// (rangeHolds).
func intRangeHolds(r *qdrant.Range, v *qdrant.Value) bool {
	n, ok := v.GetKind().(*qdrant.Value_IntegerValue)
	if !ok {
		return false
	}
	x := n.IntegerValue
	return (r.Lt == nil || x < rustInt(r.GetLt())) &&
		(r.Gt == nil || x > rustInt(r.GetGt())) &&
		(r.Lte == nil || x <= rustInt(r.GetLte())) &&
		(r.Gte == nil || x >= rustInt(r.GetGte()))
}

// rustInt converts f as Rust's "f as i64" does: toward zero, NaN to 0,
// and out-of-range values to the nearest bound.
func rustInt(f float64) int64 {
	switch {
	case math.IsNaN(f):
		return 0
	case f >= math.MaxInt64:
		return math.MaxInt64
	case f <= math.MinInt64:
		return math.MinInt64
	}
	return int64(f)
}
