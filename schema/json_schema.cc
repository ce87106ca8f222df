#include "schema/json_schema.h"

#include <charconv>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "schema/keys.h"

namespace ddprun {
namespace {

using Json = nlohmann::ordered_json;

Json Names(std::span<const std::string_view> names) {
  Json out = Json::array();
  for (std::string_view name : names) out.push_back(name);
  return out;
}

Json IntegerSchema(IntRange range) {
  Json s = {{"type", "integer"}};
  if (range.min == range.max) {
    s["const"] = range.min;
    return s;
  }
  s["minimum"] = range.min;
  // INT64_MAX stands for "no maximum": JSON numbers that large lose precision in editors.
  if (range.max != IntRange{}.max) s["maximum"] = range.max;
  return s;
}

Json DefaultOf(const KeySpec& key) {
  if (key.type == KeyType::kInteger) {
    int64_t value = 0;
    std::from_chars(key.default_value.data(), key.default_value.data() + key.default_value.size(), value);
    return value;
  }
  return key.default_value;
}

Json StringSchema(const KeySpec& key) {
  Json s = {{"type", "string"}};
  if (!key.values.empty()) s["enum"] = Names(key.values);
  if (!key.examples.empty()) s["examples"] = Names(key.examples);
  if (key.max_length > 0) {
    s["minLength"] = 1;
    s["maxLength"] = key.max_length;
  }
  if (!key.pattern.empty()) s["pattern"] = key.pattern;
  return s;
}

Json ArraySchema(const KeySpec& key, Json items) {
  Json s = {{"type", "array"}, {"items", std::move(items)}};
  if (key.min_items > 0) s["minItems"] = key.min_items;
  if (key.unique) s["uniqueItems"] = true;
  return s;
}

Json SectionSchema(const SectionSpec& section, std::string_view doc);

// The schema of one key, without its description.
Json ValueSchema(const KeySpec& key, std::string_view section) {
  switch (key.type) {
    case KeyType::kInteger:
      return IntegerSchema(*key.range);
    case KeyType::kString:
      return StringSchema(key);
    case KeyType::kStringOrInteger:
      return {{"type", {"string", "integer"}}};
    case KeyType::kDuration:
      return {{"type", "string"}, {"pattern", "^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h|d))+$"}};
    case KeyType::kDurationOrAuto:
      return {{"type", "string"}, {"pattern", "^(auto|([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h|d))+)$"}};
    case KeyType::kStringArray: {
      Json items = {{"type", "string"}};
      if (key.nonempty_items) items["minLength"] = 1;
      if (!key.pattern.empty()) items["pattern"] = key.pattern;
      return ArraySchema(key, std::move(items));
    }
    case KeyType::kIntegerArray:
      return ArraySchema(key, IntegerSchema(*key.item_range));
    case KeyType::kStringMap:
      return {{"type", "object"},
              {"propertyNames", {{"pattern", key.pattern}}},
              {"additionalProperties", {{"type", "string"}}}};
    case KeyType::kDevices: {
      Json ids = ArraySchema(key, IntegerSchema(*key.item_range));
      ids["maxItems"] = key.range->max;
      return {{"oneOf", {IntegerSchema(*key.range), std::move(ids)}}};
    }
    case KeyType::kCountOrNames: {
      Json names = {{"type", "array"},
                    {"items", {{"type", "string"}, {"minLength", 1}}},
                    {"uniqueItems", true},
                    {"maxItems", key.range->max}};
      return {{"oneOf", {IntegerSchema(*key.range), std::move(names)}}};
    }
    case KeyType::kConsole:
      return {{"oneOf",
               {{{"type", "string"}, {"enum", Names(key.values)}},
                ArraySchema(key, IntegerSchema(*key.item_range))}}};
    case KeyType::kSection:
      return SectionSchema(SectionNamed(key.name), key.doc);
    case KeyType::kSectionArray: {
      const SectionSpec& items = SectionNamed(fmt::format("{}.{}", section, key.name));
      return {{"type", "array"}, {"items", SectionSchema(items, items.doc)}};
    }
  }
  return Json::object();
}

Json KeySchema(const KeySpec& key, std::string_view section) {
  Json s = ValueSchema(key, section);
  if (key.type == KeyType::kDuration || key.type == KeyType::kDurationOrAuto) {
    s["description"] = fmt::format(
        "{} A duration such as \"250ms\", \"30s\", \"15m\", \"2h\", "
        "\"1h30m\".",
        key.doc);
  } else if (key.type != KeyType::kSection) {
    s["description"] = key.doc;
  }
  if (!key.default_value.empty()) s["default"] = DefaultOf(key);
  return s;
}

Json SectionSchema(const SectionSpec& section, std::string_view doc) {
  Json properties = Json::object();
  Json required = Json::array();
  for (const KeySpec& key : section.keys) {
    properties[std::string(key.name)] = KeySchema(key, section.name);
    if (key.required) required.push_back(key.name);
  }
  Json s = {{"type", "object"}};
  if (!doc.empty()) s["description"] = doc;
  s["properties"] = std::move(properties);
  if (!required.empty()) s["required"] = std::move(required);
  if (!section.any_of_required.empty()) {
    Json any_of = Json::array();
    for (std::string_view name : section.any_of_required) {
      any_of.push_back({{"required", {name}}});
    }
    s["anyOf"] = std::move(any_of);
  }
  if (section.open) {
    // [trainer]: any other key reaches the script as a Python literal.
    s["additionalProperties"] = {
        {"type", {"boolean", "integer", "number", "string", "array", "object"}},
        {"description",
         "Any TOML value but a date or time; it reaches the script as a Python literal of the "
         "same type (1.0 stays a float)."}};
  } else {
    s["additionalProperties"] = false;
  }
  return s;
}

}  // namespace

std::string JobFileJsonSchema() {
  Json schema = {{"$schema", "https://json-schema.org/draft/2020-12/schema"},
                 {"title", "ddprun job file (version 1)"},
                 {"description",
                  "A multi-node PyTorch DDP job for ddprun. See docs/job-file.md for every "
                  "rule."}};
  schema.update(SectionSchema(SectionNamed(""), ""));
  return schema.dump(2);
}

}  // namespace ddprun
