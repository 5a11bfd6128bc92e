package qdranttest

import (
	"github.com/qdrant/go-client/qdrant"
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
		return badInput("Validation error in body: [filter: key must not be empty]")
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
			return badInput("Validation error in body: [filter: match value is required]")
		default:
			return unsupported("this match kind (text, phrase, except)")
		}
	}
	return nil
}

// matches evaluates a checked filter on a point: every must, at least one
// should (when there are any), no must_not, and min_should.
func matches(f *qdrant.Filter, p *point) bool {
	if f == nil {
		return true
	}
	for _, c := range f.GetMust() {
		if !holds(c, p) {
			return false
		}
	}
	for _, c := range f.GetMustNot() {
		if holds(c, p) {
			return false
		}
	}
	if should := f.GetShould(); len(should) > 0 {
		found := false
		for _, c := range should {
			if holds(c, p) {
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
		for _, c := range ms.GetConditions() {
			if holds(c, p) {
				n++
			}
		}
		if n < ms.GetMinCount() {
			return false
		}
	}
	return true
}

func holds(c *qdrant.Condition, p *point) bool {
	switch v := c.GetConditionOneOf().(type) {
	case *qdrant.Condition_Field:
		return fieldHolds(v.Field, p.payload[v.Field.GetKey()])
	case *qdrant.Condition_HasId:
		for _, id := range v.HasId.GetHasId() {
			if pid, err := parsePointID(id); err == nil && pid == p.id {
				return true
			}
		}
		return false
	case *qdrant.Condition_Filter:
		return matches(v.Filter, p)
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
// it holds when it holds for any element, as in Qdrant.
func fieldHolds(f *qdrant.FieldCondition, v *qdrant.Value) bool {
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
	if f.Range != nil && !anyValue(values, func(x *qdrant.Value) bool { return rangeHolds(f.Range, x) }) {
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
