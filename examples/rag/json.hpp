#pragma once
// A minimal JSON reader for the workload files (objects, arrays, strings, numbers, literals).
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace relokv_rag {

struct json {
  enum class kind { kNull, kBool, kNumber, kString, kArray, kObject } k = kind::kNull;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<json> arr;
  std::map<std::string, json> obj;

  [[nodiscard]] const json& at(const std::string& key) const {
    const auto it = obj.find(key);
    if (k != kind::kObject || it == obj.end())
      throw std::runtime_error("json: no key '" + key + "'");
    return it->second;
  }
  [[nodiscard]] bool has(const std::string& key) const {
    return k == kind::kObject && obj.count(key) != 0;
  }

  /// Parses one JSON value; `where` names the input in errors.
  static json parse(const std::string& s, const std::string& where) {
    std::size_t i = 0;
    json v = value(s, i, where);
    ws(s, i);
    if (i != s.size()) fail(where, i, "trailing characters");
    return v;
  }

 private:
  [[noreturn]] static void fail(const std::string& where, std::size_t at, const std::string& what) {
    throw std::runtime_error(where + ": offset " + std::to_string(at) + ": " + what);
  }
  static void ws(const std::string& s, std::size_t& i) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  static void utf8(std::string& o, std::uint32_t cp) {
    if (cp < 0x80) {
      o += static_cast<char>(cp);
    } else if (cp < 0x800) {
      o += static_cast<char>(0xC0 | (cp >> 6));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      o += static_cast<char>(0xE0 | (cp >> 12));
      o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      o += static_cast<char>(0xF0 | (cp >> 18));
      o += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      o += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  static std::uint32_t hex4(const std::string& s, std::size_t& i, const std::string& where) {
    if (i + 4 > s.size()) fail(where, i, "short \\u escape");
    const std::uint32_t v = static_cast<std::uint32_t>(std::stoul(s.substr(i, 4), nullptr, 16));
    i += 4;
    return v;
  }
  static std::string string(const std::string& s, std::size_t& i, const std::string& where) {
    ++i;  // opening quote
    std::string o;
    while (i < s.size() && s[i] != '"') {
      if (s[i] != '\\') {
        o += s[i++];
        continue;
      }
      if (++i >= s.size()) break;
      const char e = s[i++];
      switch (e) {
        case 'n':
          o += '\n';
          break;
        case 't':
          o += '\t';
          break;
        case 'r':
          o += '\r';
          break;
        case 'b':
          o += '\b';
          break;
        case 'f':
          o += '\f';
          break;
        case 'u': {
          std::uint32_t cp = hex4(s, i, where);
          if (cp >= 0xD800 && cp < 0xDC00 && i + 6 <= s.size() && s[i] == '\\' && s[i + 1] == 'u') {
            i += 2;
            const std::uint32_t lo = hex4(s, i, where);
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8(o, cp);
          break;
        }
        default:
          o += e;
      }
    }
    if (i >= s.size()) fail(where, i, "unterminated string");
    ++i;
    return o;
  }
  static json value(const std::string& s, std::size_t& i, const std::string& where) {
    ws(s, i);
    if (i >= s.size()) fail(where, i, "unexpected end");
    json v;
    const char c = s[i];
    if (c == '{') {
      v.k = kind::kObject;
      ++i;
      ws(s, i);
      if (i < s.size() && s[i] == '}') return ++i, v;
      while (true) {
        ws(s, i);
        if (i >= s.size() || s[i] != '"') fail(where, i, "expected a key");
        std::string key = string(s, i, where);
        ws(s, i);
        if (i >= s.size() || s[i] != ':') fail(where, i, "expected ':'");
        ++i;
        v.obj[key] = value(s, i, where);
        ws(s, i);
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == '}') {
          ++i;
          return v;
        }
        fail(where, i, "expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.k = kind::kArray;
      ++i;
      ws(s, i);
      if (i < s.size() && s[i] == ']') return ++i, v;
      while (true) {
        v.arr.push_back(value(s, i, where));
        ws(s, i);
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == ']') {
          ++i;
          return v;
        }
        fail(where, i, "expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.k = kind::kString;
      v.str = string(s, i, where);
      return v;
    }
    if (s.compare(i, 4, "true") == 0) {
      v.k = kind::kBool;
      v.b = true;
      i += 4;
      return v;
    }
    if (s.compare(i, 5, "false") == 0) {
      v.k = kind::kBool;
      i += 5;
      return v;
    }
    if (s.compare(i, 4, "null") == 0) {
      i += 4;
      return v;
    }
    std::size_t end = i;
    while (end < s.size() && std::string("+-0123456789.eE").find(s[end]) != std::string::npos)
      ++end;
    if (end == i) fail(where, i, "unexpected character");
    v.k = kind::kNumber;
    v.num = std::stod(s.substr(i, end - i));
    i = end;
    return v;
  }
};

}  // namespace relokv_rag
