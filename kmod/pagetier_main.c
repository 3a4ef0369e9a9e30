// SPDX-License-Identifier: GPL-2.0
/*
 * pagetier.ko's face: /dev/pagetier and its ioctls, /sys/kernel/pagetier, module load and unload.
 * The targets and their scan work live in target.c, how a mode tracks accesses in mode_*.c
 * behind struct pagetier_mode_ops.
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

/* knobs (sysfs), with safe bounds */
/* per scan period, in page-table entries examined (a present one counts more); 0: no limit */
unsigned int pagetier_scan_budget = 1U << 23;
/* skip page tables whose upper-level Accessed bit stayed clear since the last pass */
unsigned int pagetier_upper_bits = 1;
/* every this many passes, each PUD's table is read whatever its bit (0: never) */
unsigned int pagetier_pud_refresh = 16;
/*
 * abit mode: a pass clears the upper-level Accessed bits this long before it tests them, and
 * reads the page tables below those used meanwhile (0: the bits set since the last pass).
 * A region the window finds unused is carried over, its pages reported with no frequency.
 */
unsigned int pagetier_upper_window_ms = 20;
#define UPPER_WINDOW_MS_MAX 1000
/*
 * abit mode: a window in which the target touched none of its tracked memory (no PUD's
 * Accessed bit set: it was not running) is waited again, up to this many windows in all.
 */
unsigned int pagetier_upper_window_max = 5;
atomic64_t pagetier_window_waits = ATOMIC64_INIT(0);
#define UPPER_WINDOW_MAX_MAX 64
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

static long do_attach(struct file *file, struct pagetier_attach __user *arg)
{
	struct pagetier_attach a;
	unsigned int i;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	for (i = 0; i < ARRAY_SIZE(a.reserved); i++)
		if (a.reserved[i])
			return -EINVAL;
	if ((a.flags & ~PAGETIER_ATTACH_READONLY_FILES) || a.reserved0)
		return -EINVAL;
	if (!mode_ops(a.mode) || a.pid == 0 || a.pid > PID_MAX_LIMIT)
		return -EINVAL;
	if (a.scan_period_ms && (a.scan_period_ms < PAGETIER_SCAN_PERIOD_MIN_MS ||
				 a.scan_period_ms > PAGETIER_SCAN_PERIOD_MAX_MS))
		return -EINVAL;
	if (a.sample_ratio > PAGETIER_SAMPLE_RATIO_MAX)
		return -EINVAL;
	return pagetier_target_attach(file, &a, mode_ops(a.mode));
}

static long do_detach(struct pagetier_detach __user *arg)
{
	struct pagetier_detach d;

	if (copy_from_user(&d, arg, sizeof(d)))
		return -EFAULT;
	if (d.flags || d.reserved[0] || d.reserved[1])
		return -EINVAL;
	return pagetier_target_detach(d.pid);
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
	unsigned long region = ULONG_MAX;
	bool carried = false;
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

			/* a region the last pass carried over: not accessed, no frequency */
			if (xas.xa_index >> (PMD_SHIFT - PAGE_SHIFT) != region) {
				region = xas.xa_index >> (PMD_SHIFT - PAGE_SHIFT);
				carried = pagetier_region_carried(t, region);
			}
			chunk[n++] = (struct pagetier_record){
				.addr = (u64)xas.xa_index << PAGE_SHIFT,
				.count = v & PT_COUNT_MASK,
				.node = node ? node - 1 : PAGETIER_NODE_NONE,
				.flags = PAGETIER_REC_PRESENT |
					 ((v & PT_HUGE) ? PAGETIER_REC_HUGE : 0) |
					 (acc ? PAGETIER_REC_ACCESSED : 0) |
					 pagetier_entry_kind_flags(v),
				.freq = carried ? 0 : pagetier_entry_freq(t, v),
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

/* A READ, READ_PAGES or READ_REGIONS request, checked; the results go back into it. */
struct read_req {
	u32 pid;
	u32 flags;
	bool regions;	  /* region records, or per-page ones */
	void __user *buf; /* buf_len records fit: access_ok() checked */
	u64 buf_len;
	unsigned long index, last; /* the first and last page (or region) index to read */
	u64 nr_records;		   /* out */
	u64 cursor;		   /* out: where the next call resumes, 0 when done */
};

/*
 * Copy records out from the kernel's copy of a chunk, no lock held; READ_RESET takes their counts
 * off once they are out.
 */
static long read_records(struct read_req *q)
{
	size_t size = q->regions ? sizeof(struct pagetier_region) : sizeof(struct pagetier_record);
	unsigned int per_chunk = q->regions ? READ_REGION_CHUNK : READ_CHUNK, want, n, nr_pages = 0;
	struct pagetier_record *pages = NULL;
	unsigned long index = q->index, egen;
	struct pagetier_target *t;
	u64 done = 0;
	long ret = 0;
	bool more = false;
	void *chunk;

	chunk = kmalloc_array(per_chunk, size, GFP_KERNEL);
	/* the pages a reset takes counts off (up to 384 KiB): only a reset needs them */
	if (q->regions && (q->flags & PAGETIER_READ_RESET))
		pages = kvmalloc_array(per_chunk * PT_REGION_PAGES, sizeof(*pages), GFP_KERNEL);
	if (!chunk || (q->regions && (q->flags & PAGETIER_READ_RESET) && !pages)) {
		ret = -ENOMEM;
		goto out_free;
	}
	t = pagetier_target_get(q->pid);
	if (!t) {
		ret = -ESRCH;
		goto out_free;
	}
	while (done < q->buf_len && index <= q->last) {
		want = min_t(u64, per_chunk, q->buf_len - done);
		n = range_chunk(t, q->regions, q->flags, &index, q->last, chunk, want, &more, &egen,
				pages, &nr_pages);
		if (n && copy_to_user(q->buf + done * size, chunk, n * size)) {
			ret = -EFAULT; /* this chunk's counts stay */
			break;
		}
		if (q->flags & PAGETIER_READ_RESET) {
			if (q->regions && nr_pages)
				reset_chunk(t, pages, nr_pages, egen);
			else if (!q->regions && n)
				reset_chunk(t, chunk, n, egen);
		}
		done += n;
		if (!more)
			break;
		cond_resched();
	}
	pagetier_target_put(t);
	q->nr_records = done;
	q->cursor = more && index <= q->last ? index : 0;
out_free:
	kvfree(pages);
	kfree(chunk);
	return ret;
}

/* The checks READ and the range reads share; @size is one record's. */
static long read_req_init(struct read_req *q, u32 pid, u32 flags, const u64 *reserved, u64 buf,
			  u64 buf_len, u64 cursor, size_t size)
{
	if ((flags & ~(PAGETIER_READ_RESET | PAGETIER_READ_ACCESSED_ONLY)) || reserved[0] ||
	    reserved[1] || cursor > ULONG_MAX)
		return -EINVAL;
	*q = (struct read_req){ .pid = pid, .flags = flags, .buf = u64_to_user_ptr(buf),
				.buf_len = buf_len, .index = cursor, .last = ULONG_MAX };
	/* array_size() saturates: a length that overflows fails access_ok() */
	if (buf_len && !access_ok(q->buf, array_size(buf_len, size)))
		return -EFAULT;
	return 0;
}

/* Hand @r (@size bytes, its @nr_records and @cursor from @q) back to user space. */
static long read_reply(void __user *arg, void *r, size_t size, u64 *nr_records, u64 *cursor,
		       const struct read_req *q)
{
	*nr_records = q->nr_records;
	*cursor = q->cursor;
	return copy_to_user(arg, r, size) ? -EFAULT : 0;
}

/* READ: per-page records of the whole address space. */
static long do_read(struct pagetier_read __user *arg)
{
	struct pagetier_read r;
	struct read_req q;
	long ret;

	if (copy_from_user(&r, arg, sizeof(r)))
		return -EFAULT;
	ret = read_req_init(&q, r.pid, r.flags, r.reserved, r.buf, r.buf_len, r.cursor,
			    sizeof(struct pagetier_record));
	if (!ret)
		ret = read_records(&q);
	return ret ?: read_reply(arg, &r, sizeof(r), &r.nr_records, &r.cursor, &q);
}

/* READ_PAGES (@regions false) and READ_REGIONS: READ over an address range. */
static long do_read_range(struct pagetier_read_range __user *arg, bool regions)
{
	size_t size = regions ? sizeof(struct pagetier_region) : sizeof(struct pagetier_record);
	unsigned int shift = regions ? PMD_SHIFT : PAGE_SHIFT;
	struct pagetier_read_range r;
	struct read_req q;
	long ret;

	if (copy_from_user(&r, arg, sizeof(r)))
		return -EFAULT;
	if (r.start > ULONG_MAX || r.end > ULONG_MAX || (r.end && r.start >= r.end))
		return -EINVAL;
	ret = read_req_init(&q, r.pid, r.flags, r.reserved, r.buf, r.buf_len, r.cursor, size);
	if (ret)
		return ret;
	q.regions = regions;
	q.last = (r.end ? (unsigned long)r.end - 1 : ULONG_MAX) >> shift;
	q.index = max_t(unsigned long, r.cursor, (unsigned long)r.start >> shift);
	ret = read_records(&q);
	return ret ?: read_reply(arg, &r, sizeof(r), &r.nr_records, &r.cursor, &q);
}

static long do_stats(struct pagetier_stats __user *arg)
{
	struct pagetier_stats s;
	struct pagetier_target *t;

	if (copy_from_user(&s, arg, sizeof(s)))
		return -EFAULT;
	t = pagetier_target_get(s.pid);
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
		.pages_shmem = READ_ONCE(t->pages_shmem),
		.pages_file = READ_ONCE(t->pages_file),
	};
	pagetier_target_put(t);
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
	t = pagetier_target_get(u.pid);
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
	pagetier_target_put(t);
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
	pagetier_detach_owned(file);
	return 0;
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
	return pagetier_targets_emit(buf);
}

PT_DEFINE_UINT_KNOB(default_scan_period_ms, pagetier_default_scan_period_ms,
		    PAGETIER_SCAN_PERIOD_MIN_MS, PAGETIER_SCAN_PERIOD_MAX_MS)
PT_DEFINE_UINT_KNOB(max_targets, pagetier_max_targets, 1, MAX_TARGETS_LIMIT)

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

/* 1: passes skip page tables whose upper-level Accessed bit stayed clear; 0: read them all */
PT_DEFINE_UINT_KNOB(upper_bits, pagetier_upper_bits, 0, 1)
PT_DEFINE_UINT_KNOB(pud_refresh, pagetier_pud_refresh, 0, PUD_REFRESH_MAX)
PT_DEFINE_UINT_KNOB(upper_window_ms, pagetier_upper_window_ms, 0, UPPER_WINDOW_MS_MAX)
PT_DEFINE_UINT_KNOB(upper_window_max, pagetier_upper_window_max, 1, UPPER_WINDOW_MAX_MAX)

/* abit's windows waited again (the target touched nothing in one), since the module loaded */
static ssize_t window_waits_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%lld\n", (long long)atomic64_read(&pagetier_window_waits));
}

static struct kobj_attribute version_attr = __ATTR_RO(version);
static struct kobj_attribute targets_attr = __ATTR_RO(targets);
static struct kobj_attribute default_scan_period_ms_attr = __ATTR_RW(default_scan_period_ms);
static struct kobj_attribute max_targets_attr = __ATTR_RW(max_targets);
static struct kobj_attribute scan_budget_attr = __ATTR_RW(scan_budget);
static struct kobj_attribute upper_bits_attr = __ATTR_RW(upper_bits);
static struct kobj_attribute pud_refresh_attr = __ATTR_RW(pud_refresh);
static struct kobj_attribute upper_window_ms_attr = __ATTR_RW(upper_window_ms);
static struct kobj_attribute upper_window_max_attr = __ATTR_RW(upper_window_max);
static struct kobj_attribute window_waits_attr = __ATTR_RO(window_waits);

static struct attribute *pagetier_attrs[] = {
	&version_attr.attr,
	&targets_attr.attr,
	&default_scan_period_ms_attr.attr,
	&max_targets_attr.attr,
	&scan_budget_attr.attr,
	&upper_bits_attr.attr,
	&pud_refresh_attr.attr,
	&upper_window_ms_attr.attr,
	&upper_window_max_attr.attr,
	&window_waits_attr.attr,
	&pagetier_probe_windows_attr.attr,
	&pagetier_probe_base_us_attr.attr,
	&pagetier_probe_every_attr.attr,
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
	ret = pagetier_targets_init();
	if (ret)
		return ret;
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
	pagetier_targets_exit();
	return ret;
}

static void __exit pagetier_exit(void)
{
	misc_deregister(&pagetier_dev); /* no new ioctls */
	/* detach everything, restoring every page a mode left inaccessible */
	pagetier_targets_exit();
	sysfs_remove_group(pagetier_kobj, &pagetier_group);
	kobject_put(pagetier_kobj);
	pagetier_fault_exit();
	pr_info("unloaded\n");
}

module_init(pagetier_init);
module_exit(pagetier_exit);

MODULE_LICENSE("GPL");
MODULE_AUTHOR("pagetier developers");
MODULE_DESCRIPTION("Per-process page-access counting through PTE bits");
MODULE_VERSION(PAGETIER_VERSION_STRING);
