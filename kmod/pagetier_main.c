// SPDX-License-Identifier: GPL-2.0
/*
 * pagetier.ko core: /dev/pagetier and its ioctls, /sys/kernel/pagetier, the targets and their
 * scan timers. How a mode tracks accesses lives in mode_*.c behind struct pagetier_mode_ops.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/capability.h>
#include <linux/fs.h>
#include <linux/kobject.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/ptrace.h>
#include <linux/rculist.h>
#include <linux/sched/mm.h>
#include <linux/sched/task.h>
#include <linux/slab.h>
#include <linux/sysfs.h>
#include <linux/uaccess.h>

#include "pagetier.h"

/*
 * targets_lock guards the list of targets (pagetier_targets, nr_targets, each target's node and
 * linked) and nothing else: it is held only to look a target up and take a reference, or to add
 * or unlink one, never across user memory, a target's mmap_lock or a walk. The fault hook reads
 * the list under RCU. Each target's own fields are documented with struct pagetier_target.
 */
LIST_HEAD(pagetier_targets);
static DEFINE_MUTEX(targets_lock);
static unsigned int nr_targets;
static struct workqueue_struct *scan_wq;

/* knobs (sysfs), with safe bounds */
static unsigned int default_scan_period_ms = 1000;
static unsigned int max_targets = 64;
/* per scan period, in page-table entries examined (a present one counts more); 0: no limit */
unsigned int pagetier_scan_budget = 1U << 23;
/* skip page tables whose upper-level Accessed bit stayed clear since the last pass */
unsigned int pagetier_upper_bits = 1;
/* every this many passes, each PUD's table is read whatever its bit (0: never) */
unsigned int pagetier_pud_refresh = 16;
#define PUD_REFRESH_MAX 4096
#define MAX_TARGETS_LIMIT 4096
#define SCAN_BUDGET_MIN 4096
#define READ_CHUNK 256
#define READ_REGION_CHUNK 32 /* region records per chunk: up to 512 per-page counts each */
#define UNMARK_BATCH 4096 /* addresses unmarked under one hold of the target's mmap_lock */

static const struct pagetier_mode_ops *mode_ops(u32 mode)
{
	switch (mode) {
	case PAGETIER_MODE_FAULT:
		return &pagetier_fault_ops;
	case PAGETIER_MODE_ABIT:
		return &pagetier_abit_ops;
	}
	return NULL;
}

/**
 * pagetier_find_mm_rcu() - the target tracking @mm.
 * @mm: an address space.
 *
 * Context: rcu_read_lock() held.
 * Return: the target, or NULL.
 */
struct pagetier_target *pagetier_find_mm_rcu(struct mm_struct *mm)
{
	struct pagetier_target *t;

	list_for_each_entry_rcu(t, &pagetier_targets, node) {
		if (READ_ONCE(t->mm) == mm)
			return t;
	}
	return NULL;
}

/**
 * pagetier_count_access() - count one access to the tracked page at @index.
 * @t: the target.
 * @index: virtual address >> PAGE_SHIFT; untracked pages are ignored.
 *
 * Context: any, except with t->pages' lock held. Never allocates.
 */
void pagetier_count_access(struct pagetier_target *t, unsigned long index)
{
	XA_STATE(xas, &t->pages, index);
	unsigned long v;
	void *entry;

	xas_lock(&xas);
	entry = xas_load(&xas);
	if (xa_is_value(entry)) {
		v = xa_to_value(entry);
		if ((v & PT_COUNT_MASK) != PT_COUNT_MASK)
			v++;
		xas_store(&xas, xa_mk_value(v | PT_SEEN)); /* replaces a present entry: no allocation */
		xas_set_mark(&xas, PT_ACCESSED);
		atomic64_inc(&t->accesses);
	}
	xas_unlock(&xas);
}

static struct pagetier_target *find_pid_locked(pid_t pid)
{
	struct pagetier_target *t;

	lockdep_assert_held(&targets_lock);
	list_for_each_entry(t, &pagetier_targets, node) {
		if (t->pid == pid)
			return t;
	}
	return NULL;
}

/* The last reference is gone: nothing else can reach @t. */
static void target_release(struct kref *ref)
{
	struct pagetier_target *t = container_of(ref, struct pagetier_target, ref);

	xa_destroy(&t->pages);
	xa_destroy(&t->regions);
	mmdrop(t->mm);
	put_pid(t->spid);
	kfree(t);
}

static void target_put(struct pagetier_target *t)
{
	kref_put(&t->ref, target_release);
}

/* The target attached for @pid, with a reference the caller puts; or NULL. */
static struct pagetier_target *target_get(pid_t pid)
{
	struct pagetier_target *t;

	mutex_lock(&targets_lock);
	t = find_pid_locked(pid);
	if (t)
		kref_get(&t->ref);
	mutex_unlock(&targets_lock);
	return t;
}

/* Take @t off the list; the caller then owns the list's reference. */
static void target_unlink_locked(struct pagetier_target *t)
{
	lockdep_assert_held(&targets_lock);
	list_del_rcu(&t->node);
	t->linked = false;
	nr_targets--;
}

/*
 * The target's address space is gone: if the process lives on, it called execve. Follow it to
 * its new address space, with fresh counts. Runs in the scan work, the only writer of t->mm.
 * Return: true if the target now tracks that one.
 */
static bool follow_exec(struct pagetier_target *t)
{
	struct task_struct *task = get_pid_task(t->spid, PIDTYPE_PID);
	struct mm_struct *mm = task ? get_task_mm(task) : NULL;
	struct mm_struct *old = t->mm;

	if (task)
		put_task_struct(task);
	if (!mm)
		return false;
	if (mm == old) { /* exiting, not yet gone */
		mmput(mm);
		return false;
	}
	mmgrab(mm);
	mmput(mm);
	down_write(&t->mm_lock);
	WRITE_ONCE(t->mm, mm); /* the fault hook only compares this pointer */
	t->exec_gen++;
	xa_destroy(&t->pages);
	xa_destroy(&t->regions);
	up_write(&t->mm_lock);
	t->pass_started = false;
	t->walked_last = 0;
	WRITE_ONCE(t->pages_tracked, 0);
	mmdrop(old);
	pr_debug("pid %d called execve; following it\n", t->pid);
	return true;
}

/* Unlinked by someone else: wait until the fault hook and the scan are done with @t. */
static void target_quiesce(struct pagetier_target *t)
{
	WRITE_ONCE(t->stopping, true); /* a scan work probing ends at its next window */
	synchronize_rcu();
	cancel_delayed_work_sync(&t->work);
}

/* Undo every change the mode made to the target's page tables, if its address space lives. */
static void target_restore(struct pagetier_target *t)
{
	struct mm_struct *mm;

	if (!t->ops->detach)
		return;
	down_read(&t->mm_lock);
	mm = t->mm;
	if (mmget_not_zero(mm)) {
		mmap_read_lock(mm);
		t->ops->detach(t);
		mmap_read_unlock(mm);
		mmput(mm);
	}
	up_read(&t->mm_lock);
}

static void scan_work(struct work_struct *work)
{
	struct pagetier_target *t = container_of(to_delayed_work(work), struct pagetier_target, work);
	bool mine = false;
	int ret = pagetier_scan(t);

	if (ret == -ESRCH && follow_exec(t))
		ret = pagetier_scan(t);
	if (ret != -ESRCH) {
		queue_delayed_work(scan_wq, &t->work, msecs_to_jiffies(t->scan_period_ms));
		return;
	}
	/* the target exited: forget it, unless whoever unlinked it already owns it */
	mutex_lock(&targets_lock);
	if (t->linked) {
		target_unlink_locked(t);
		mine = true;
	}
	mutex_unlock(&targets_lock);
	if (!mine)
		return;
	pr_info("pid %d exited; forgotten\n", t->pid);
	synchronize_rcu(); /* the fault hook may still look at it */
	target_put(t); /* the list's: a work item may free itself */
}

static long do_attach(struct file *file, struct pagetier_attach __user *arg)
{
	struct pagetier_attach a;
	struct pagetier_target *t;
	struct task_struct *task;
	struct mm_struct *mm;
	unsigned int i;
	long ret;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	for (i = 0; i < ARRAY_SIZE(a.reserved); i++)
		if (a.reserved[i])
			return -EINVAL;
	if (!mode_ops(a.mode) || a.pid == 0 || a.pid > PID_MAX_LIMIT)
		return -EINVAL;
	if (a.scan_period_ms && (a.scan_period_ms < PAGETIER_SCAN_PERIOD_MIN_MS ||
				 a.scan_period_ms > PAGETIER_SCAN_PERIOD_MAX_MS))
		return -EINVAL;
	if (a.sample_ratio > PAGETIER_SAMPLE_RATIO_MAX)
		return -EINVAL;

	t = kzalloc(sizeof(*t), GFP_KERNEL);
	if (!t)
		return -ENOMEM;
	t->spid = find_get_pid(a.pid);
	task = t->spid ? get_pid_task(t->spid, PIDTYPE_PID) : NULL;
	if (!task) {
		ret = -ESRCH;
		goto err_pid;
	}
	if (task->flags & PF_KTHREAD) {
		ret = -EINVAL;
		goto err_task;
	}
	/* the check /proc/PID/pagemap applies to its readers */
	if (!pt_ptrace_may_access(task, PTRACE_MODE_READ_FSCREDS)) {
		ret = -EACCES;
		goto err_task;
	}
	mm = get_task_mm(task);
	if (!mm) {
		ret = -ESRCH; /* exiting */
		goto err_task;
	}
	mmgrab(mm);
	mmput(mm);
	put_task_struct(task);

	kref_init(&t->ref); /* the list's */
	t->pid = a.pid;
	t->owner = file;
	t->mm = mm;
	init_rwsem(&t->mm_lock);
	t->ops = mode_ops(a.mode);
	t->scan_period_ms = a.scan_period_ms ?: READ_ONCE(default_scan_period_ms);
	t->sample_ratio = max_t(u32, a.sample_ratio, 1);
	t->page_budget = a.page_budget;
	xa_init(&t->pages);
	xa_init(&t->regions);
	INIT_DELAYED_WORK(&t->work, scan_work);

	mutex_lock(&targets_lock);
	rcu_read_lock();
	ret = pagetier_find_mm_rcu(mm) ? -EBUSY : 0;
	rcu_read_unlock();
	if (!ret && find_pid_locked(a.pid))
		ret = -EBUSY;
	if (!ret && nr_targets >= READ_ONCE(max_targets))
		ret = -ENOSPC;
	if (ret) {
		mutex_unlock(&targets_lock);
		target_put(t);
		return ret;
	}
	list_add_tail_rcu(&t->node, &pagetier_targets);
	t->linked = true;
	nr_targets++;
	queue_delayed_work(scan_wq, &t->work, 0);
	mutex_unlock(&targets_lock);
	pr_debug("attached pid %d, mode %s\n", t->pid, t->ops->name);
	return 0;

err_task:
	put_task_struct(task);
err_pid:
	put_pid(t->spid);
	kfree(t);
	return ret;
}

/* The caller unlinked @t and owns the list's reference: stop, restore, put. */
static void detach_target(struct pagetier_target *t)
{
	target_quiesce(t);
	target_restore(t);
	target_put(t);
}

static long do_detach(struct pagetier_detach __user *arg)
{
	struct pagetier_detach d;
	struct pagetier_target *t;

	if (copy_from_user(&d, arg, sizeof(d)))
		return -EFAULT;
	if (d.flags || d.reserved[0] || d.reserved[1])
		return -EINVAL;
	mutex_lock(&targets_lock);
	t = find_pid_locked(d.pid);
	if (t)
		target_unlink_locked(t);
	mutex_unlock(&targets_lock);
	if (!t)
		return -ESRCH;
	detach_target(t);
	return 0;
}

/*
 * Copy up to @want records of @t from *@index on (to @last at most) into @chunk, under the
 * xarray's lock. On return *@index is where the next chunk starts and *@more says whether
 * entries remain there. Return: the number of records; *@egen the target's exec_gen they
 * belong to.
 */
static unsigned int read_chunk(struct pagetier_target *t, u32 flags, unsigned long *index,
			       unsigned long last, struct pagetier_record *chunk,
			       unsigned int want, bool *more, unsigned long *egen)
{
	XA_STATE(xas, &t->pages, *index);
	unsigned int n = 0;
	void *entry;

	*more = false;
	down_read(&t->mm_lock); /* an execve empties the counts under it */
	*egen = t->exec_gen;
	xas_lock(&xas);
	for (;;) {
		if (flags & PAGETIER_READ_ACCESSED_ONLY)
			entry = xas_find_marked(&xas, last, PT_ACCESSED);
		else
			entry = xas_find(&xas, last);
		if (!entry)
			break;
		if (n == want) {
			*more = true; /* found, not taken: the next chunk starts here */
			break;
		}
		if (xa_is_value(entry)) {
			unsigned long v = xa_to_value(entry);
			unsigned long node = (v & PT_NODE_MASK) >> PT_NODE_SHIFT;
			bool acc = xas_get_mark(&xas, PT_ACCESSED);

			chunk[n++] = (struct pagetier_record){
				.addr = (u64)xas.xa_index << PAGE_SHIFT,
				.count = v & PT_COUNT_MASK,
				.node = node ? node - 1 : PAGETIER_NODE_NONE,
				.flags = PAGETIER_REC_PRESENT |
					 ((v & PT_HUGE) ? PAGETIER_REC_HUGE : 0) |
					 (acc ? PAGETIER_REC_ACCESSED : 0),
				.freq = pagetier_entry_freq(t, v),
			};
		}
	}
	*index = xas.xa_index;
	xas_unlock(&xas);
	up_read(&t->mm_lock);
	return n;
}

/*
 * READ_RESET, for records already copied out: take the counts they reported off their entries
 * (accesses counted since they were copied stay), and clear "accessed" where nothing is left.
 * An entry gone since, or counts emptied by an execve, is left alone.
 */
static void reset_chunk(struct pagetier_target *t, const struct pagetier_record *chunk,
			unsigned int n, unsigned long egen)
{
	XA_STATE(xas, &t->pages, 0);
	unsigned long v, left;
	unsigned int i;
	void *entry;

	down_read(&t->mm_lock);
	if (t->exec_gen != egen)
		goto out;
	xas_lock(&xas);
	for (i = 0; i < n; i++) {
		xas_set(&xas, chunk[i].addr >> PAGE_SHIFT);
		entry = xas_load(&xas);
		if (!xa_is_value(entry))
			continue;
		v = xa_to_value(entry);
		left = (v & PT_COUNT_MASK) - min_t(unsigned long, v & PT_COUNT_MASK, chunk[i].count);
		xas_store(&xas, xa_mk_value((v & ~PT_COUNT_MASK) | left)); /* present: no allocation */
		if (!left)
			xas_clear_mark(&xas, PT_ACCESSED);
	}
	xas_unlock(&xas);
out:
	up_read(&t->mm_lock);
}

static long do_read(struct pagetier_read __user *arg)
{
	struct pagetier_read r;
	struct pagetier_record *chunk;
	struct pagetier_target *t;
	struct pagetier_record __user *ubuf;
	unsigned long index, egen;
	unsigned int n;
	u64 done = 0;
	long ret = 0;
	bool more = false;

	if (copy_from_user(&r, arg, sizeof(r)))
		return -EFAULT;
	if ((r.flags & ~(PAGETIER_READ_RESET | PAGETIER_READ_ACCESSED_ONLY)) || r.reserved[0] ||
	    r.reserved[1] || r.cursor > ULONG_MAX)
		return -EINVAL;
	ubuf = u64_to_user_ptr(r.buf);
	/* array_size() saturates: a length that overflows fails access_ok() */
	if (r.buf_len && !access_ok(ubuf, array_size(r.buf_len, sizeof(*chunk))))
		return -EFAULT;
	chunk = kmalloc_array(READ_CHUNK, sizeof(*chunk), GFP_KERNEL);
	if (!chunk)
		return -ENOMEM;
	t = target_get(r.pid);
	if (!t) {
		kfree(chunk);
		return -ESRCH;
	}
	/* records go out from the kernel copy, no lock held; counts reset once they are out */
	index = r.cursor;
	while (done < r.buf_len) {
		n = read_chunk(t, r.flags, &index, ULONG_MAX, chunk,
			       min_t(u64, READ_CHUNK, r.buf_len - done), &more, &egen);
		if (n && copy_to_user(ubuf + done, chunk, n * sizeof(*chunk))) {
			ret = -EFAULT; /* this chunk's counts stay */
			break;
		}
		if (n && (r.flags & PAGETIER_READ_RESET))
			reset_chunk(t, chunk, n, egen);
		done += n;
		if (!more)
			break;
	}
	target_put(t);
	kfree(chunk);
	if (ret)
		return ret;
	r.nr_records = done;
	r.cursor = more ? index : 0;
	return copy_to_user(arg, &r, sizeof(r)) ? -EFAULT : 0;
}

/*
 * READ_PAGES' and READ_REGIONS' records of one chunk, from *@index on up to @last: per-page
 * records into @out, or region records (then @pages gets the per-page records they add up, for
 * the reset). Return: the number of records.
 */
static unsigned int range_chunk(struct pagetier_target *t, bool regions, u32 flags,
				unsigned long *index, unsigned long last, void *out,
				unsigned int want, bool *more, unsigned long *egen,
				struct pagetier_record *pages, unsigned int *nr_pages)
{
	unsigned int n;

	if (!regions)
		return read_chunk(t, flags, index, last, out, want, more, egen);
	down_read(&t->mm_lock); /* an execve empties the tables under it */
	*egen = t->exec_gen;
	n = pagetier_regions_chunk(t, flags, index, last, out, want, more, pages, nr_pages);
	up_read(&t->mm_lock);
	return n;
}

/* READ_PAGES (@regions false) and READ_REGIONS: READ over an address range. */
static long do_read_range(struct pagetier_read_range __user *arg, bool regions)
{
	size_t size = regions ? sizeof(struct pagetier_region) : sizeof(struct pagetier_record);
	unsigned int shift = regions ? PMD_SHIFT : PAGE_SHIFT, want, n, nr_pages = 0;
	unsigned int per_chunk = regions ? READ_REGION_CHUNK : READ_CHUNK;
	struct pagetier_record *pages = NULL;
	unsigned long index, last, egen;
	struct pagetier_read_range r;
	struct pagetier_target *t;
	void __user *ubuf;
	u64 done = 0;
	long ret = 0;
	bool more = false;
	void *chunk;

	if (copy_from_user(&r, arg, sizeof(r)))
		return -EFAULT;
	if ((r.flags & ~(PAGETIER_READ_RESET | PAGETIER_READ_ACCESSED_ONLY)) || r.reserved[0] ||
	    r.reserved[1] || r.cursor > ULONG_MAX || r.start > ULONG_MAX || r.end > ULONG_MAX ||
	    (r.end && r.start >= r.end))
		return -EINVAL;
	ubuf = u64_to_user_ptr(r.buf);
	if (r.buf_len && !access_ok(ubuf, array_size(r.buf_len, size)))
		return -EFAULT;
	last = (r.end ? (unsigned long)r.end - 1 : ULONG_MAX) >> shift;
	index = max_t(unsigned long, r.cursor, (unsigned long)r.start >> shift);
	chunk = kmalloc_array(per_chunk, size, GFP_KERNEL);
	if (regions)
		pages = kvmalloc_array(per_chunk * PT_REGION_PAGES, sizeof(*pages), GFP_KERNEL);
	if (!chunk || (regions && !pages)) {
		ret = -ENOMEM;
		goto out_free;
	}
	t = target_get(r.pid);
	if (!t) {
		ret = -ESRCH;
		goto out_free;
	}
	while (done < r.buf_len && index <= last) {
		want = min_t(u64, per_chunk, r.buf_len - done);
		n = range_chunk(t, regions, r.flags, &index, last, chunk, want, &more, &egen, pages,
				&nr_pages);
		if (n && copy_to_user(ubuf + done * size, chunk, n * size)) {
			ret = -EFAULT; /* this chunk's counts stay */
			break;
		}
		if (r.flags & PAGETIER_READ_RESET) {
			if (regions && nr_pages)
				reset_chunk(t, pages, nr_pages, egen);
			else if (!regions && n)
				reset_chunk(t, chunk, n, egen);
		}
		done += n;
		if (!more)
			break;
		cond_resched();
	}
	target_put(t);
	if (ret)
		goto out_free;
	r.nr_records = done;
	r.cursor = more && index <= last ? index : 0;
	ret = copy_to_user(arg, &r, sizeof(r)) ? -EFAULT : 0;
out_free:
	kvfree(pages);
	kfree(chunk);
	return ret;
}

static long do_stats(struct pagetier_stats __user *arg)
{
	struct pagetier_stats s;
	struct pagetier_target *t;
	unsigned int i;

	if (copy_from_user(&s, arg, sizeof(s)))
		return -EFAULT;
	for (i = 0; i < ARRAY_SIZE(s.reserved); i++)
		if (s.reserved[i])
			return -EINVAL;
	t = target_get(s.pid);
	if (!t)
		return -ESRCH;
	s = (struct pagetier_stats){
		.pid = t->pid,
		.mode = t->ops->mode,
		.scans = READ_ONCE(t->scans),
		.pages_tracked = READ_ONCE(t->pages_tracked),
		.pages_marked = READ_ONCE(t->pages_marked),
		.faults = atomic64_read(&t->faults),
		.accesses = atomic64_read(&t->accesses),
		.scan_ns = READ_ONCE(t->scan_ns),
		.probe_ns = READ_ONCE(t->probe_ns),
		.units_probed = READ_ONCE(t->units_probed),
		.walk_entries = READ_ONCE(t->walk_entries),
		.scan_resumes = READ_ONCE(t->scan_resumes),
		.regions_tracked = READ_ONCE(t->regions_tracked),
		.regions_idle = READ_ONCE(t->regions_idle),
	};
	target_put(t);
	return copy_to_user(arg, &s, sizeof(s)) ? -EFAULT : 0;
}

static long do_unmark(struct pagetier_unmark __user *arg)
{
	struct pagetier_unmark u;
	struct pagetier_target *t;
	struct mm_struct *mm;
	u64 *addrs, i, n;
	long ret = 0;

	if (copy_from_user(&u, arg, sizeof(u)))
		return -EFAULT;
	if (u.flags || u.reserved[0] || u.reserved[1] || u.nr > PAGETIER_UNMARK_MAX)
		return -EINVAL;
	addrs = kvmalloc_array(u.nr ?: 1, sizeof(*addrs), GFP_KERNEL);
	if (!addrs)
		return -ENOMEM;
	if (copy_from_user(addrs, u64_to_user_ptr(u.addrs), array_size(u.nr, sizeof(*addrs)))) {
		kvfree(addrs);
		return -EFAULT;
	}
	u.done = 0;
	t = target_get(u.pid);
	if (!t) {
		kvfree(addrs);
		return -ESRCH;
	}
	pagetier_region_rewalk(t, addrs, u.nr); /* their nodes change: read them next pass */
	if (t->ops->unmark && u.nr) {
		/* t->mm stays this mm while mm_lock is held: an execve waits */
		down_read(&t->mm_lock);
		mm = t->mm;
		if (mmget_not_zero(mm)) {
			for (i = 0; i < u.nr && !ret; i += n) {
				n = min_t(u64, u.nr - i, UNMARK_BATCH);
				if (mmap_read_lock_killable(mm)) {
					ret = -EINTR;
					break;
				}
				u.done += t->ops->unmark(t, addrs + i, n);
				mmap_read_unlock(mm);
				cond_resched();
			}
			mmput(mm);
		}
		up_read(&t->mm_lock);
	}
	target_put(t);
	kvfree(addrs);
	if (!ret && copy_to_user(arg, &u, sizeof(u)))
		ret = -EFAULT;
	return ret;
}

static long pagetier_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case PAGETIER_IOC_VERSION: {
		struct pagetier_version v = {
			.major = PAGETIER_VERSION_MAJOR,
			.minor = PAGETIER_VERSION_MINOR,
			.patch = PAGETIER_VERSION_PATCH,
			.record_size = sizeof(struct pagetier_record),
		};
		return copy_to_user(uarg, &v, sizeof(v)) ? -EFAULT : 0;
	}
	case PAGETIER_IOC_ATTACH:
		return do_attach(file, uarg);
	case PAGETIER_IOC_DETACH:
		return do_detach(uarg);
	case PAGETIER_IOC_READ:
		return do_read(uarg);
	case PAGETIER_IOC_STATS:
		return do_stats(uarg);
	case PAGETIER_IOC_UNMARK:
		return do_unmark(uarg);
	case PAGETIER_IOC_READ_REGIONS:
		return do_read_range(uarg, true);
	case PAGETIER_IOC_READ_PAGES:
		return do_read_range(uarg, false);
	}
	return -ENOTTY;
}

static int pagetier_open(struct inode *inode, struct file *file)
{
	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	return 0;
}

/*
 * The last reference to a descriptor is gone (close, or its process died, SIGKILL included):
 * detach the targets attached through it, so that no process stays marked by a dead profiler.
 */
static int pagetier_release(struct inode *inode, struct file *file)
{
	struct pagetier_target *t, *found;

	for (;;) {
		found = NULL;
		mutex_lock(&targets_lock);
		list_for_each_entry(t, &pagetier_targets, node) {
			if (t->owner == file) {
				found = t;
				break;
			}
		}
		if (found)
			target_unlink_locked(found);
		mutex_unlock(&targets_lock);
		if (!found)
			return 0;
		pr_debug("pid %d detached: its descriptor was closed\n", found->pid);
		detach_target(found);
	}
}

static const struct file_operations pagetier_fops = {
	.owner = THIS_MODULE,
	.open = pagetier_open,
	.release = pagetier_release,
	.unlocked_ioctl = pagetier_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.llseek = noop_llseek,
};

static struct miscdevice pagetier_dev = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = PAGETIER_DEVICE_NAME,
	.fops = &pagetier_fops,
	.mode = 0600,
};

/* --- /sys/kernel/pagetier --- */

static ssize_t version_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%s\n", PAGETIER_VERSION_STRING);
}

static ssize_t targets_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	struct pagetier_target *t;
	int len = 0;

	mutex_lock(&targets_lock);
	list_for_each_entry(t, &pagetier_targets, node)
		len += sysfs_emit_at(buf, len, "%d %s %llu %llu\n", t->pid, t->ops->name,
				     READ_ONCE(t->scans), READ_ONCE(t->pages_tracked));
	mutex_unlock(&targets_lock);
	return len;
}

/**
 * pagetier_uint_store() - parse a sysfs write into @knob, if within [@lo, @hi].
 * @buf: what was written.
 * @count: its length.
 * @knob: the value to set.
 * @lo: the smallest value allowed.
 * @hi: the largest value allowed.
 *
 * Return: @count, or -EINVAL (out of range) or kstrtouint()'s error.
 */
ssize_t pagetier_uint_store(const char *buf, size_t count, unsigned int *knob, unsigned int lo,
			    unsigned int hi)
{
	unsigned int v;
	int ret = kstrtouint(buf, 0, &v);

	if (ret)
		return ret;
	if (v < lo || v > hi)
		return -EINVAL;
	WRITE_ONCE(*knob, v);
	return count;
}

static ssize_t default_scan_period_ms_show(struct kobject *kobj, struct kobj_attribute *attr,
					   char *buf)
{
	return sysfs_emit(buf, "%u\n", READ_ONCE(default_scan_period_ms));
}

static ssize_t default_scan_period_ms_store(struct kobject *kobj, struct kobj_attribute *attr,
					    const char *buf, size_t count)
{
	return pagetier_uint_store(buf, count, &default_scan_period_ms, PAGETIER_SCAN_PERIOD_MIN_MS,
			  PAGETIER_SCAN_PERIOD_MAX_MS);
}

static ssize_t max_targets_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%u\n", READ_ONCE(max_targets));
}

static ssize_t max_targets_store(struct kobject *kobj, struct kobj_attribute *attr,
				 const char *buf, size_t count)
{
	return pagetier_uint_store(buf, count, &max_targets, 1, MAX_TARGETS_LIMIT);
}

static ssize_t scan_budget_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%u\n", READ_ONCE(pagetier_scan_budget));
}

/* 0: no limit; otherwise at least SCAN_BUDGET_MIN, so that every period makes progress */
static ssize_t scan_budget_store(struct kobject *kobj, struct kobj_attribute *attr,
				 const char *buf, size_t count)
{
	unsigned int v;
	int ret = kstrtouint(buf, 0, &v);

	if (ret)
		return ret;
	if (v && v < SCAN_BUDGET_MIN)
		return -EINVAL;
	WRITE_ONCE(pagetier_scan_budget, v);
	return count;
}

static ssize_t upper_bits_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%u\n", READ_ONCE(pagetier_upper_bits));
}

/* 1: passes skip page tables whose upper-level Accessed bit stayed clear; 0: read them all */
static ssize_t upper_bits_store(struct kobject *kobj, struct kobj_attribute *attr,
				const char *buf, size_t count)
{
	return pagetier_uint_store(buf, count, &pagetier_upper_bits, 0, 1);
}

static ssize_t pud_refresh_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%u\n", READ_ONCE(pagetier_pud_refresh));
}

static ssize_t pud_refresh_store(struct kobject *kobj, struct kobj_attribute *attr,
				 const char *buf, size_t count)
{
	return pagetier_uint_store(buf, count, &pagetier_pud_refresh, 0, PUD_REFRESH_MAX);
}

static struct kobj_attribute version_attr = __ATTR_RO(version);
static struct kobj_attribute targets_attr = __ATTR_RO(targets);
static struct kobj_attribute default_scan_period_ms_attr = __ATTR_RW(default_scan_period_ms);
static struct kobj_attribute max_targets_attr = __ATTR_RW(max_targets);
static struct kobj_attribute scan_budget_attr = __ATTR_RW(scan_budget);
static struct kobj_attribute upper_bits_attr = __ATTR_RW(upper_bits);
static struct kobj_attribute pud_refresh_attr = __ATTR_RW(pud_refresh);

static struct attribute *pagetier_attrs[] = {
	&version_attr.attr,
	&targets_attr.attr,
	&default_scan_period_ms_attr.attr,
	&max_targets_attr.attr,
	&scan_budget_attr.attr,
	&upper_bits_attr.attr,
	&pud_refresh_attr.attr,
	&pagetier_probe_windows_attr.attr,
	&pagetier_probe_base_us_attr.attr,
	&pagetier_probe_fault_marks_attr.attr,
	NULL,
};

static const struct attribute_group pagetier_group = { .attrs = pagetier_attrs };
static struct kobject *pagetier_kobj;

static int __init pagetier_init(void)
{
	int ret;

	ret = pagetier_ksyms_init();
	if (ret)
		return ret;
	scan_wq = alloc_workqueue("pagetier", WQ_UNBOUND, 0);
	if (!scan_wq)
		return -ENOMEM;
	ret = pagetier_fault_init();
	if (ret)
		goto err_wq;
	pagetier_kobj = kobject_create_and_add("pagetier", kernel_kobj);
	if (!pagetier_kobj) {
		ret = -ENOMEM;
		goto err_fault;
	}
	ret = sysfs_create_group(pagetier_kobj, &pagetier_group);
	if (ret)
		goto err_kobj;
	ret = misc_register(&pagetier_dev);
	if (ret)
		goto err_kobj;
	pr_info("version %s loaded\n", PAGETIER_VERSION_STRING);
	return 0;

err_kobj:
	kobject_put(pagetier_kobj);
err_fault:
	pagetier_fault_exit();
err_wq:
	destroy_workqueue(scan_wq);
	return ret;
}

static void __exit pagetier_exit(void)
{
	struct pagetier_target *t;

	misc_deregister(&pagetier_dev); /* no new ioctls */
	/* detach everything, restoring every page a mode left inaccessible */
	for (;;) {
		mutex_lock(&targets_lock);
		t = list_first_entry_or_null(&pagetier_targets, struct pagetier_target, node);
		if (t)
			target_unlink_locked(t);
		mutex_unlock(&targets_lock);
		if (!t)
			break;
		detach_target(t);
	}
	sysfs_remove_group(pagetier_kobj, &pagetier_group);
	kobject_put(pagetier_kobj);
	pagetier_fault_exit();
	destroy_workqueue(scan_wq);
	pr_info("unloaded\n");
}

module_init(pagetier_init);
module_exit(pagetier_exit);

MODULE_LICENSE("GPL");
MODULE_AUTHOR("pagetier developers");
MODULE_DESCRIPTION("Per-process page-access counting through PTE bits");
MODULE_VERSION(PAGETIER_VERSION_STRING);
