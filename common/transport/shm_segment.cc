#include "common/transport/shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace pdserve::transport {
namespace {

constexpr int kNonceBytes = 16;

absl::StatusOr<std::string> RandomBytes(int n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t r = getrandom(out.data() + got, out.size() - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return absl::InternalError(
          absl::StrCat("getrandom: ", std::strerror(errno)));
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

absl::Status ErrnoError(absl::string_view what, const std::string& name,
                        int err) {
  const std::string msg =
      absl::StrCat(what, " ", name, ": ", std::strerror(err));
  if (err == ENOSPC || err == ENOMEM || err == EMFILE || err == ENFILE) {
    return absl::ResourceExhaustedError(msg);
  }
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::UnavailableError(msg);
}

}  // namespace

absl::StatusOr<std::string> RandomShmName(absl::string_view prefix) {
  auto bytes = RandomBytes(16);
  if (!bytes.ok()) return bytes.status();
  return absl::StrCat(prefix, getpid(), "-", absl::BytesToHexString(*bytes));
}

ShmSegment::ShmSegment(std::string name, char* data, int64_t size,
                       bool writable)
    : name_(std::move(name)),
      data_(data),
      size_(size),
      writable_(writable),
      unlinked_(!writable) {}

ShmSegment::~ShmSegment() {
  munmap(data_, static_cast<size_t>(size_));
  if (writable_) Unlink();
}

void ShmSegment::Unlink() {
  if (!unlinked_.exchange(true)) shm_unlink(name_.c_str());
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::Create(
    absl::string_view prefix, int64_t size) {
  if (size <= 0) return absl::InvalidArgumentError("empty shm segment");
  auto name = RandomShmName(prefix);
  if (!name.ok()) return name.status();
  const int fd = shm_open(name->c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return ErrnoError("shm_open", *name, errno);
  auto fail = [&](absl::string_view what, int err) {
    close(fd);
    shm_unlink(name->c_str());
    return ErrnoError(what, *name, err);
  };
  if (ftruncate(fd, size) != 0) return fail("ftruncate", errno);
  // Reserve the pages now: writing to a sparse segment on a full tmpfs would
  // raise SIGBUS instead of an error.
  if (int err = posix_fallocate(fd, 0, size); err != 0) {
    return fail("posix_fallocate", err);
  }
  // MAP_POPULATE: one bulk page-table fill instead of a fault per page.
  void* p = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return fail("mmap", errno);
  close(fd);
  return std::unique_ptr<ShmSegment>(
      new ShmSegment(*std::move(name), static_cast<char*>(p), size, true));
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ShmSegment::OpenReadOnly(
    const std::string& name, int64_t size) {
  if (name.size() < 2 || name[0] != '/' ||
      name.find('/', 1) != std::string::npos || size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad shm segment '", name, "' of ", size, " bytes"));
  }
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return ErrnoError("shm_open", name, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoError("fstat", name, err);
  }
  if (st.st_size != size) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "shm segment ", name, " has ", st.st_size, " bytes, expected ", size));
  }
  void* p = mmap(nullptr, static_cast<size_t>(size), PROT_READ,
                 MAP_SHARED | MAP_POPULATE, fd, 0);
  const int err = errno;
  close(fd);
  if (p == MAP_FAILED) return ErrnoError("mmap", name, err);
  return std::unique_ptr<ShmSegment>(
      new ShmSegment(name, static_cast<char*>(p), size, false));
}

absl::StatusOr<std::unique_ptr<ShmProbe>> ShmProbe::Create() {
  auto nonce = RandomBytes(kNonceBytes);
  if (!nonce.ok()) return nonce.status();
  auto segment = ShmSegment::Create(kShmProbePrefix, kNonceBytes);
  if (!segment.ok()) return segment.status();
  std::memcpy((*segment)->mutable_data(), nonce->data(), nonce->size());
  return std::unique_ptr<ShmProbe>(
      new ShmProbe(*std::move(segment), *std::move(nonce)));
}

bool ShmProbeMatches(const std::string& name, absl::string_view nonce) {
  if (nonce.size() != kNonceBytes) return false;
  auto segment = ShmSegment::OpenReadOnly(name, kNonceBytes);
  if (!segment.ok()) return false;
  return absl::string_view((*segment)->data(), kNonceBytes) == nonce;
}

int SweepStaleShmSegments(absl::Duration min_age) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  const absl::Time now = absl::Now();
  while (dirent* e = readdir(dir)) {
    absl::string_view name = e->d_name;
    absl::string_view rest;
    for (absl::string_view prefix : {kShmKvPrefix, kShmProbePrefix}) {
      prefix.remove_prefix(1);  // the leading '/'
      if (absl::StartsWith(name, prefix)) rest = name.substr(prefix.size());
    }
    const size_t dash = rest.find('-');
    int pid = 0;
    if (dash == absl::string_view::npos ||
        !absl::SimpleAtoi(rest.substr(0, dash), &pid) || pid <= 0 ||
        pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) {
      continue;  // not ours, or its creator lives (or is not ours to probe)
    }
    struct stat st;
    const std::string path = absl::StrCat("/dev/shm/", name);
    if (stat(path.c_str(), &st) != 0 ||
        now - absl::FromTimeT(st.st_mtime) < min_age) {
      continue;
    }
    if (shm_unlink(absl::StrCat("/", name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace pdserve::transport
