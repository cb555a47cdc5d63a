#pragma once
/// @file
/// A store in a directory: one file per entry, written under a temporary name and renamed (a
/// crash never leaves a torn entry under a key), read into a buffer (only regular files within
/// a size bound, never through a link, never blocking on a FIFO; a file truncated or replaced
/// while it is read is a miss, not a fault).
/// POSIX only. A shared directory (NFS, a parallel file system) shares blocks between hosts.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "relokv/concepts/kv_store.hpp"
#include "relokv/detail/buffer_pool.hpp"

RELOKV_NAMESPACE_BEGIN

struct file_store_options {
  /// fsync each entry before the rename (survives power loss, costs a disk flush per block).
  /// Without it a crash of the machine may leave an entry short; its checksum rejects it.
  bool durable = false;
  /// The largest entry read: a file larger than any block is a miss, counted (oversized). A
  /// cache lowers it to the largest block its layout encodes to (limit_value_bytes).
  std::size_t max_entry_bytes = std::size_t{256} << 20;
  /// A tenant's own subdirectory (letters, digits, '.', '_', '-'; not "." or ".."): entries go
  /// to DIR/PREFIX/, so that an operator can give each tenant a directory of its own.
  std::string prefix;
};

/// Entries are `DIR[/PREFIX]/<32 hex digits of the key>.rkv`. The directories the store creates
/// are 0700 and its files 0600: only the user that runs the engine reads them (a directory
/// shared on purpose keeps the modes its operator gave it). Writers in several processes may share
/// the directory: each writes its own temporary file (`.tmp.<pid>.<n>.<key>`) and renames it,
/// so readers see the old entry or the new one, whole. Entries must never be modified in place
/// (a reader would see a short file, a miss); replace them by rename.
class file_store {
 public:
  /// @throws error when `dir` cannot be created or is not a directory, or for a bad prefix
  explicit file_store(std::filesystem::path dir, file_store_options opt = {})
      : dir_(std::move(dir)), opt_(std::move(opt)), counters_(std::make_shared<store_counters>()) {
    if (!opt_.prefix.empty()) {
      if (opt_.prefix == "." || opt_.prefix == ".." ||
          opt_.prefix.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789._-") != std::string::npos)
        throw error("file_store: prefix '" + opt_.prefix +
                    "' is not a directory name of letters, digits, '.', '_' and '-'");
      dir_ /= opt_.prefix;
    }
    make_private_dirs(dir_);
  }

  store_status get(std::span<const store_key> keys, std::vector<store_blob>& out) {
    store_counters& c = *counters_;
    ++c.get_calls;
    c.keys_requested += static_cast<std::int64_t>(keys.size());
    out.assign(keys.size(), store_blob{});
    bool failed = false;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      // Only a regular file of at most max_entry_bytes, opened without following a link and
      // without blocking (a FIFO renamed over an entry must not hold the plan), read into a
      // buffer: a file truncated under the reader is a short read, never a fault.
      const std::string path = path_of(keys[i]);
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
      if (fd < 0) {
        failed = failed || errno != ENOENT;
        continue;
      }
      struct stat st {};
      if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        failed = true;
        continue;
      }
      const auto n = static_cast<std::size_t>(st.st_size);
      if (n > opt_.max_entry_bytes) {
        ::close(fd);
        ++c.oversized;
        continue;
      }
      std::shared_ptr<detail::buffer_pool::buffer> buf = pool_.take(n);
      std::size_t got = 0;
      while (got < n) {
        const ssize_t r = ::pread(fd, buf->bytes.get() + got, n - got, static_cast<off_t>(got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += static_cast<std::size_t>(r);
      }
      ::close(fd);
      if (got != n) {  // truncated while read: a miss, never part of an entry
        failed = true;
        continue;
      }
      const std::span<const std::byte> view(buf->bytes.get(), n);
      out[i] = store_blob(std::move(buf), view);
      ++c.keys_found;
      c.bytes_read += static_cast<std::int64_t>(n);
    }
    // An unreadable entry is a miss; the call still answers for the others.
    if (failed) ++c.unavailable;
    return store_status::kOk;
  }

  store_status put(std::span<const store_key> keys,
                   std::span<const std::span<const std::byte>> values) {
    store_counters& c = *counters_;
    ++c.put_calls;
    bool ok = true;
    for (std::size_t i = 0; i < keys.size() && i < values.size(); ++i) {
      if (write_one(keys[i], values[i])) {
        ++c.keys_written;
        c.bytes_written += static_cast<std::int64_t>(values[i].size());
      } else {
        ++c.put_rejected;
        ok = false;
      }
    }
    if (!ok) ++c.unavailable;
    return ok ? store_status::kOk : store_status::kUnavailable;
  }

  store_status contains(std::span<const store_key> keys, std::vector<std::uint8_t>& out) const {
    out.assign(keys.size(), 0);
    for (std::size_t i = 0; i < keys.size(); ++i)
      out[i] = ::access(path_of(keys[i]).c_str(), F_OK) == 0 ? 1 : 0;
    return store_status::kOk;
  }
  store_status erase(std::span<const store_key> keys) {
    bool ok = true;
    for (const store_key& k : keys)
      if (::unlink(path_of(k).c_str()) != 0 && errno != ENOENT) ok = false;
    return ok ? store_status::kOk : store_status::kUnavailable;
  }
  [[nodiscard]] store_counters counters() const noexcept { return *counters_; }
  /// Lowers max_entry_bytes to n (never raises it): the cache passes the largest entry its
  /// layout encodes to.
  void limit_value_bytes(std::size_t n) noexcept {
    opt_.max_entry_bytes = std::min(opt_.max_entry_bytes, n);
  }

  /// The file an entry lives in.
  [[nodiscard]] std::string path_of(const store_key& k) const {
    return (dir_ / (k.hex() + ".rkv")).string();
  }
  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }

 private:
  bool write_one(const store_key& k, std::span<const std::byte> v) {
    static std::atomic<std::uint64_t> seq{0};
    const std::string tmp = (dir_ / (".tmp." + std::to_string(::getpid()) + "." +
                                     std::to_string(seq.fetch_add(1)) + "." + k.hex()))
                                .string();
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    const std::byte* p = v.data();
    std::size_t left = v.size();
    bool ok = true;
    while (ok && left > 0) {
      const ssize_t w = ::write(fd, p, left);
      if (w < 0 && errno == EINTR) continue;
      ok = w > 0;
      if (ok) {
        p += w;
        left -= static_cast<std::size_t>(w);
      }
    }
    if (ok && opt_.durable) ok = ::fsync(fd) == 0;
    ok = ::close(fd) == 0 && ok;
    if (ok) ok = ::rename(tmp.c_str(), path_of(k).c_str()) == 0;
    if (!ok) ::unlink(tmp.c_str());
    return ok;
  }

  /// Creates the missing directories of `d`, each 0700 (whatever the umask); leaves the ones
  /// that exist as they are.
  static void make_private_dirs(const std::filesystem::path& d) {
    std::filesystem::path at;
    for (const auto& part : d) {
      at /= part;
      if (::mkdir(at.c_str(), 0700) == 0) {
        (void)::chmod(at.c_str(), 0700);
      } else if (errno != EEXIST) {
        throw error("file_store: cannot create '" + at.string() + "' (" + std::strerror(errno) +
                    ")");
      }
    }
    std::error_code ec;
    if (!std::filesystem::is_directory(d, ec))
      throw error("file_store: '" + d.string() + "' is not a directory");
  }

  std::filesystem::path dir_;
  file_store_options opt_;
  std::shared_ptr<store_counters> counters_;
  detail::buffer_pool pool_;
};

static_assert(kv_store<file_store>, "file_store must model kv_store");

RELOKV_NAMESPACE_END
